"""Checkpoint and data-file integrity on ranks: CRC-32s combined from parts equal zlib's of the whole file, the
ranks' shared checksum gives every rank the same figures as one process reading each file whole, and a save that a
frozen peer breaks ends after one collective timeout."""

import os
import random
import time
import zlib
from datetime import timedelta

import pytest
import torch

from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.checkpoint import integrity
from megatron_neobert.checkpoint.integrity import crc32_combine, shared_crc32


def test_combined_checksums_equal_zlibs_of_the_concatenation():
    rng = random.Random(0)
    for first_length in (0, 1, 3, 4096, 70_001):
        for second_length in (0, 1, 8, 65_537):
            first, second = rng.randbytes(first_length), rng.randbytes(second_length)
            assert crc32_combine(zlib.crc32(first), zlib.crc32(second), second_length) == zlib.crc32(first + second)


def _shared_crc32_in_small_parts(paths, part_bytes):
    integrity._PART = part_bytes  # this rank's process only
    return shared_crc32(paths)


@pytest.mark.integration  # starts ranks
def test_ranks_sharing_the_parts_of_files_get_each_files_checksum(tmp_path):
    rng = random.Random(1)
    paths = []
    for n, size in enumerate((0, 999, 1000, 5001, 12_345)):  # empty, under, at and over several parts of 1000
        paths.append(str(tmp_path / f"file{n}"))
        with open(paths[-1], "wb") as f:
            f.write(rng.randbytes(size))
    contents = {p: open(p, "rb").read() for p in paths}
    whole = {p: {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"} for p, data in contents.items()}
    assert run_on_ranks(_shared_crc32_in_small_parts, 3, paths, 1000) == [whole] * 3



def _save_with_a_frozen_peer(root: str, timeout_s: float):
    """On process groups whose collectives time out after `timeout_s`: rank 1 freezes inside its save (it
    sleeps through two timeouts), rank 0's save waits for it in a collective of another group, as megatron-core's
    fully parallel save does in the data-parallel group. Returns this rank's error and when it came, from the
    save's start."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    store = torch.distributed.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, is_master=False)
    torch.distributed.destroy_process_group()
    torch.distributed.init_process_group("gloo", store=torch.distributed.PrefixStore("short", store), rank=rank,
                                         world_size=world, timeout=timedelta(seconds=timeout_s))
    data_parallel = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    def save():
        if rank == 1:
            time.sleep(2.5 * timeout_s)
        else:
            torch.distributed.barrier(group=data_parallel)

    start = time.monotonic()
    try:
        integrity.write_verified_folder(save, root, os.path.join(root, "iter_0000001"), 1)
    except Exception as err:
        return f"{type(err).__name__}: {err}".splitlines()[0], time.monotonic() - start
    return None, time.monotonic() - start


@pytest.mark.integration  # starts ranks
def test_a_peer_frozen_in_a_save_ends_it_after_one_collective_timeout(tmp_path):
    # Agreeing on the failure would take another collective, which waits for the same frozen peer: a second
    # timeout before the rank can report it (and a watchdog or launcher waits that much longer to end the job).
    timeout_s = 3.0
    (error, seconds), _ = run_on_ranks(_save_with_a_frozen_peer, 2, str(tmp_path), timeout_s)
    assert seconds < 1.5 * timeout_s, f"rank 0 raised {seconds:.1f} s into the save: {error}"
    assert error is not None and "Timed out waiting" in error, error  # the save's own collective, as gloo ended it
