"""The checksums of checkpoints and data files: CRC-32s combined from parts equal zlib's of the whole file, and
the ranks' shared checksum gives every rank the same figures as one process reading each file whole."""

import random
import zlib

import pytest

from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.training.checkpoint import integrity
from megatron_neobert.training.checkpoint.integrity import crc32_combine, file_crc32, shared_crc32


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
    whole = {p: {"bytes": len(open(p, "rb").read()), "crc32": file_crc32(p)} for p in paths}
    assert run_on_ranks(_shared_crc32_in_small_parts, 3, paths, 1000) == [whole] * 3
