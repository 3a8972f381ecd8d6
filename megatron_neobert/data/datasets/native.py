"""The data path's C helpers (``native.c``: the packed layout's sample starts, numpy's shuffle with its memory reads
issued ahead), compiled at first use with the machine's C compiler, as megatron-core
builds its own dataset helpers (``megatron.core.datasets.utils.compile_helpers``), and loaded with ctypes.

The library is kept in a per-user cache (``$XDG_CACHE_HOME/megatron_neobert``, else ``~/.cache/megatron_neobert``)
under a name made of its source, the compiler command and the machine's architecture, so it is compiled once per
machine and version; builders at once each write a name of their own and rename it (``atomic_write.commit``).
Where there is no compiler (``$CC``, else ``cc``) or no writable cache, ``library()`` is None after one line saying
why, and the callers take their numpy path: the same results, slower at corpus scale.
"""

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
from typing import Optional

import numpy

from megatron_neobert.atomic_write import commit, temporary_sibling

logger = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native.c")


def _cache_dir() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "megatron_neobert")


@functools.lru_cache(maxsize=None)
def library() -> Optional[ctypes.CDLL]:
    """The compiled helpers with their signatures, or None (said once) where they cannot be built."""
    command = [os.environ.get("CC") or "cc", "-O2", "-shared", "-fPIC"]
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + " ".join(command).encode()).hexdigest()[:16]
    path = os.path.join(_cache_dir(), f"native-{key}-{platform.machine()}.so")
    try:
        if not os.path.isfile(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = temporary_sibling(path)
            try:
                subprocess.run(command + ["-o", str(tmp), SOURCE], check=True, capture_output=True, text=True,
                               timeout=300)
                commit(tmp, path)
            finally:
                if tmp.exists():
                    tmp.unlink()
        lib = ctypes.CDLL(path)
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", None) or str(error)
        logger.warning("the data path's C helpers could not be built (%s: %s): the layout is built by numpy "
                       "instead (the same samples, slower at corpus scale)", " ".join(command),
                       detail.strip().splitlines()[-1] if detail.strip() else type(error).__name__)
        return None
    lengths = numpy.ctypeslib.ndpointer(numpy.int32, flags="C_CONTIGUOUS")
    offsets = numpy.ctypeslib.ndpointer(numpy.int32, flags="C_CONTIGUOUS,WRITEABLE")
    for dtype in (numpy.int32, numpy.int64):
        for order in (numpy.int32, numpy.int64):
            function = getattr(lib, f"pack_starts_{numpy.dtype(dtype).name}_{numpy.dtype(order).name}")
            # the order: an array of its dtype or None
            function.argtypes = [lengths, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                 numpy.ctypeslib.ndpointer(dtype, flags="C_CONTIGUOUS,WRITEABLE"), offsets,
                                 ctypes.c_int64]
            function.restype = ctypes.c_int64
        shuffle = getattr(lib, f"shuffle_{numpy.dtype(dtype).name}")
        shuffle.argtypes = [ctypes.c_void_p] * 3 + [numpy.ctypeslib.ndpointer(dtype, flags="C_CONTIGUOUS,WRITEABLE"),
                                                    ctypes.c_int64]
        shuffle.restype = None
    return lib


def shuffle(rng: numpy.random.Generator, array: numpy.ndarray) -> None:
    """``rng.shuffle(array)``: the same permutation and the same state of `rng` after, faster on a large 1-D int32 or
    int64 array where the helpers are built."""
    lib = library() if array.ndim == 1 and array.dtype in (numpy.int32, numpy.int64) else None
    if lib is None or not array.flags.c_contiguous:
        rng.shuffle(array)
        return
    bits = rng.bit_generator
    with bits.lock:  # as Generator.shuffle holds it
        getattr(lib, f"shuffle_{array.dtype.name}")(bits.ctypes.state_address, bits.ctypes.next_uint32,
                                                     bits.ctypes.next_uint64, array, array.shape[0])
