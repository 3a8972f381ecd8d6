"""Checkpoint integrity: a checksum manifest written at save, verified at load; a save that runs
out of disk space.

`checksums.json` in an iteration folder lists every file of the folder with its size and CRC-32
(zlib's, no extra dependency; 1.7 GB/s on one core of this project's idle 2-core test machine, 0.4 GB/s busy,
so ~1 s per rank for a 250M model's 3 GB checkpoint on 8 ranks). The ranks share the hashing, by parts of
files (`shared_crc32`; the data files' checksums too), reading the files back after every rank has written its
own, and rank 0 writes the manifest before the marker
moves, so a folder the marker names always has one. At load the ranks again share the files;
a file that is missing, shorter or longer, or whose bytes changed (a flipped block keeps the
size) stops the run with one line naming the file and the checkpoint, and the newest older
folder that verifies is offered (`--ckpt-step`).
"""

import errno
import json
import logging
import os
import shutil
import zlib
from typing import Dict, Iterator, List, Optional

import torch
from torch.distributed.checkpoint import CheckpointException

from megatron_neobert.atomic_write import write_json_atomic
from megatron_neobert.megatron_core_compat import keep_disk_full_in_writer_errors
from megatron_neobert.checkpoint.layout import (is_complete, iteration_dir, read_latest_iteration,
                                                         saved_iterations)
from megatron_neobert.errors import TrainingError

logger = logging.getLogger(__name__)

MANIFEST = "checksums.json"
_CHUNK = 16 << 20
# The bytes of a file one rank hashes in a shared checksum: a file's parts go to the ranks in turn, so a single large
# file (a merged corpus's .idx: ~20 GB at 1B documents, 80 parts) costs each rank its share.
_PART = 256 << 20
_CRC32_POLY = 0xEDB88320  # CRC-32's polynomial, bit-reflected as zlib computes it


def _range_crc32(path: str, start: int, length: int) -> int:
    """The CRC-32 of `length` bytes of a file from `start`."""
    crc = 0
    with open(path, "rb") as f:
        f.seek(start)
        while length > 0 and (block := f.read(min(_CHUNK, length))):
            crc = zlib.crc32(block, crc)
            length -= len(block)
    return crc


def _multiply_mod_poly(a: int, b: int) -> int:
    """a * b modulo CRC-32's polynomial, both bit-reflected (zlib's multmodp)."""
    product, bit = 0, 1 << 31
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _CRC32_POLY if b & 1 else b >> 1
    return product


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The CRC-32 of A followed by B from crc32(A), crc32(B) and B's length (zlib's crc32_combine, which Python's
    zlib does not expose): crc32(A) times x^(8 * length2), modulo the polynomial, plus crc32(B)."""
    shift, power = 1 << 31, 1 << 30  # x^0, and x^1 squared in turn: x^(2^k) for each bit k of 8 * length2
    bits = 8 * length2
    while bits:
        if bits & 1:
            shift = _multiply_mod_poly(power, shift)
        bits >>= 1
        power = _multiply_mod_poly(power, power)
    return _multiply_mod_poly(shift, crc1) ^ crc2


def shared_crc32(paths: List[str]) -> Dict[str, dict]:
    """Collective, with the same `paths` on every rank: {path: {"bytes", "crc32"}} of each file (zlib's CRC-32 of
    the whole file), on every rank. The files' parts of _PART bytes go to the ranks in turn and their checksums are
    combined, so the ranks share the reading whether there is one file or thousands."""
    sizes = [[os.path.getsize(p) for p in paths] if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(sizes, src=0)
    parts = [(i, start, min(_PART, size - start)) for i, size in enumerate(sizes[0]) for start in range(0, size, _PART)]
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    mine = [(i, start, length, _range_crc32(paths[i], start, length)) for i, start, length in parts[rank::world]]
    crcs = [0] * len(paths)
    for i, _, length, crc in sorted(part for found in _all_gather(mine) for part in found):
        crcs[i] = crc32_combine(crcs[i], crc, length)
    return {p: {"bytes": size, "crc32": f"{crc:08x}"} for p, size, crc in zip(paths, sizes[0], crcs)}


def _all_gather(obj) -> list:
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def write_manifest(folder: str) -> None:
    """Collective: checksum every file of a complete iteration folder; rank 0 writes the manifest."""
    names = [n for n in _folder_files(folder) if n != MANIFEST] if torch.distributed.get_rank() == 0 else None
    shared = [names]
    torch.distributed.broadcast_object_list(shared, src=0)
    found = shared_crc32([os.path.join(folder, n) for n in shared[0]])
    files = {n: found[os.path.join(folder, n)] for n in shared[0]}
    if torch.distributed.get_rank() == 0:
        write_json_atomic(os.path.join(folder, MANIFEST), {"algorithm": "crc32", "files": dict(sorted(files.items()))})


def _folder_files(folder: str) -> List[str]:
    found = []
    for base, _, names in os.walk(folder):
        found += [os.path.relpath(os.path.join(base, n), folder) for n in names]
    return found


def _size_problem(folder: str, name: str, written: int) -> Optional[str]:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return f"{name} is missing"
    size = os.path.getsize(path)
    if size != written:
        return f"{name} is {'truncated' if size < written else 'longer than written'} ({size} bytes, {written} written)"
    return None


def size_problem(folder: str) -> Optional[str]:
    """The first file of an iteration folder whose size is not the one its manifest records, or None (a stat each:
    for one process, where `folder_problem` checks the checksums too, collectively)."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError):
        return None
    return min(filter(None, (_size_problem(folder, n, files[n]["bytes"]) for n in sorted(files))), default=None)


def folder_problem(folder: str) -> Optional[str]:
    """Collective: the first problem of an iteration folder against its manifest, agreed by all
    ranks, or None. A folder without a manifest (saved before manifests, or by a converter) is
    not checked."""
    manifest_path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(manifest_path):
        return None
    try:
        with open(manifest_path) as f:
            files = json.load(f)["files"]
    except (ValueError, KeyError) as err:
        return f"{MANIFEST} is unreadable ({err})"
    # Rank 0 compares the sizes (a stat each), so that every rank checksums the same files: those of the right size.
    sized = [{n: _size_problem(folder, n, files[n]["bytes"]) for n in sorted(files)}
             if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(sized, src=0)
    whole = [n for n, problem in sized[0].items() if problem is None]
    found = shared_crc32([os.path.join(folder, n) for n in whole])
    problems = [problem for problem in sized[0].values() if problem]
    for n in whole:
        crc = found[os.path.join(folder, n)]["crc32"]
        if crc != files[n]["crc32"]:
            problems.append(f"{n} is corrupted (CRC-32 {crc}, {files[n]['crc32']} written)")
    return min(problems, default=None)


def previous_complete(root: str, before: int) -> Optional[int]:
    """Collective: the newest iteration folder under `root` older than `before` that verifies."""
    for it in reversed([i for i in saved_iterations(root) if i < before]):
        folder = iteration_dir(root, it)
        if is_complete(folder) and folder_problem(folder) is None:
            return it
    return None


def verify_checkpoint(folder: str, root: str, iteration: int) -> None:
    """Collective: raise a one-line TrainingError when the folder does not match its manifest (see
    `require_manifest` for a folder without one)."""
    problem = folder_problem(folder)
    if problem is None:
        return
    older = previous_complete(root, iteration)
    offer = (f"the previous complete checkpoint is iteration {older}: resume from it with --load {root} "
             f"--ckpt-step {older}" if older is not None else "no older complete checkpoint is in " + root)
    raise TrainingError(f"checkpoint {folder}: {problem}; {offer} (or --no-verify-checkpoint to load it anyway)")


def require_manifest(folder: str, training_state: bool) -> None:
    """Refuse in one line a folder that holds `training_state` but no manifest: every save of the trainer writes one,
    so it was deleted or not copied, and nothing tells a damaged file (that loads as garbage) from a sound one. A
    converter's folder (model weights only) has none: said, not refused."""
    if os.path.isfile(os.path.join(folder, MANIFEST)):
        return
    if training_state:
        raise TrainingError(f"checkpoint {folder} has no {MANIFEST}, which every save of the trainer writes "
                            f"(deleted since, or not copied with the folder): its files cannot be verified; load "
                            f"it anyway with --no-verify-checkpoint")
    if torch.distributed.get_rank() == 0:
        logger.info(f"{folder} has no {MANIFEST} (written by a converter): its files are not verified")


def _error_chain(err: Optional[BaseException]) -> Iterator[BaseException]:
    """An error and those it wraps (its cause, else its context), each once."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def is_disk_full(err: BaseException) -> bool:
    """Whether an error (megatron-core wraps its writers' errors) comes from a full disk. The writers'
    errors reach the rank, and the coordinator's CheckpointException, pickled: as text, not chained."""
    return any((isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e)
               or "ENOSPC" in str(e) for e in _error_chain(err))


# What gloo says when a peer stopped answering or left; NCCL's watchdog ends the process itself.
_COLLECTIVE_FAILURES = ("Timed out waiting", "timeout caused pair closure", "Connection closed by peer",
                        "Connection reset by peer")


def is_collective_failure(err: BaseException) -> bool:
    """Whether an error (or one it wraps, as megatron-core's checkpoint errors do) is a collective's failure: a
    peer frozen or gone. The group is unusable after it: any further collective would wait for the same peer."""
    return any(isinstance(e, torch.distributed.DistError) or any(text in str(e) for text in _COLLECTIVE_FAILURES)
               for e in _error_chain(err))


def failed_save(root: str, folder: str, iteration: int, errors: List[Optional[str]], disk_full: bool,
                detail: str = "") -> TrainingError:
    """Rank 0 removes the partial folder; the marker still names the last complete checkpoint."""
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
    latest = read_latest_iteration(root)
    kept = f"the latest complete checkpoint is still iteration {latest}" if latest is not None else "no complete checkpoint exists"
    if disk_full:
        why = f" ({detail})" if detail else ""
        return TrainingError(f"no space left on {root}{why}: the checkpoint of iteration {iteration} was not "
                             f"saved and its partial folder was removed; {kept}")
    first = next(e for e in errors if e)
    return TrainingError(f"saving iteration {iteration} to {root} failed ({first}); the partial folder was "
                         f"removed; {kept}")


def _one_line(err: Optional[BaseException]) -> Optional[str]:
    return None if err is None else (f"{type(err).__name__}: {err}".splitlines() or ["?"])[0]


def space_shortage(root: str) -> Optional[str]:
    """Why `root` cannot hold another checkpoint of the size of its latest (known from its
    manifest), or None. Checked before a save, since a write that fails on rank 0 alone, before
    megatron-core's collectives, would leave the other ranks waiting in them."""
    latest = read_latest_iteration(root)
    manifest = os.path.join(iteration_dir(root, latest), MANIFEST) if latest is not None else None
    if manifest is None or not os.path.isfile(manifest):
        return None
    with open(manifest) as f:
        need = sum(entry["bytes"] for entry in json.load(f)["files"].values())
    free = shutil.disk_usage(root).free
    return f"a checkpoint takes {need / 2**20:.1f} MiB, {free / 2**20:.1f} MiB are free" if free < need else None


def check_space(root: str, folder: str, iteration: int) -> None:
    """Collective, before a save: refuse it in one line when `root` cannot hold another checkpoint."""
    keep_disk_full_in_writer_errors(is_disk_full)
    shortage = [space_shortage(root) if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(shortage, src=0)
    if shortage[0]:
        raise failed_save(root, folder, iteration, [], disk_full=True, detail=shortage[0])


def seal_folder(failure: Optional[BaseException], root: str, folder: str, iteration: int) -> None:
    """Collective, after every rank wrote its part of `folder` (`failure`: this rank's error, if any):
    the manifest, or, when a write failed on any rank, the partial folder removed and one error raised
    on all of them."""
    reports = _all_gather((_one_line(failure), failure is not None and is_disk_full(failure)))
    if not any(text for text, _ in reports):
        try:
            write_manifest(folder)
        except OSError as err:
            failure = err
        reports = _all_gather((_one_line(failure), failure is not None and is_disk_full(failure)))
    if any(text for text, _ in reports):
        raise failed_save(root, folder, iteration, [text for text, _ in reports],
                          any(full for _, full in reports)) from failure


def sealed_at(folder: str) -> Optional[float]:
    """When `folder`'s save ended: its manifest, the last file a save writes (None for a folder without one)."""
    try:
        return os.path.getmtime(os.path.join(folder, MANIFEST))
    except OSError:
        return None


def write_verified_folder(save_fn, root: str, folder: str, iteration: int) -> None:
    """Collective: `save_fn()` writes this rank's part of `folder`; then the manifest. A failure on
    any rank (a full disk, an I/O error) raises on all of them after the partial folder is removed."""
    check_space(root, folder, iteration)
    failure = None
    try:
        save_fn()
    # Reported by every rank in seal_folder, so that no rank waits for the others. megatron-core raises
    # a writer's failure as torch's CheckpointException, a BaseException.
    except (Exception, CheckpointException) as err:
        if is_collective_failure(err):
            raise  # agreeing on it would take another collective timeout, waiting for the same peer
        failure = err
    seal_folder(failure, root, folder, iteration)
