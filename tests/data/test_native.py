"""The data path's C helpers (data/datasets/native.py): built at first use, numpy's results, numpy's path without
them. The packer's walk is tested against the sequential reference in test_data_mlm.py (its `walk` fixture)."""

import logging
import os

import numpy
import pytest

from megatron_neobert.data.datasets import native


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """library() as on a machine that has not built the helpers yet: an empty cache, the result not remembered."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native.library.cache_clear()
    yield tmp_path / "megatron_neobert"
    native.library.cache_clear()


@pytest.mark.parametrize("dtype", [numpy.int32, numpy.int64])
def test_the_shuffle_is_numpys_permutation_and_leaves_the_generator_as_numpy_does(dtype):
    assert native.library() is not None
    # Sizes about the 32 swaps drawn ahead, and one past the CPU's caches' reach of a few.
    for size in (0, 1, 2, 3, 31, 32, 33, 1000, 300_007):
        ours, theirs = numpy.arange(size, dtype=dtype), numpy.arange(size, dtype=dtype)
        ours_rng, theirs_rng = numpy.random.default_rng([7, size]), numpy.random.default_rng([7, size])
        native.shuffle(ours_rng, ours)
        theirs_rng.shuffle(theirs)
        assert numpy.array_equal(ours, theirs), size
        assert ours_rng.integers(0, 2**62) == theirs_rng.integers(0, 2**62)
    # A view that is not contiguous, and other dtypes, take numpy's own shuffle.
    for view in (lambda a: a[::2], lambda a: a.view(numpy.int16)):
        ours, theirs = numpy.arange(50, dtype=dtype), numpy.arange(50, dtype=dtype)
        native.shuffle(numpy.random.default_rng(3), view(ours))
        numpy.random.default_rng(3).shuffle(view(theirs))
        assert numpy.array_equal(ours, theirs)


def test_the_helpers_are_built_once_into_the_users_cache(fresh_build):
    assert native.library() is not None
    built = os.listdir(fresh_build)
    assert len(built) == 1 and built[0].startswith("native-") and built[0].endswith(".so")  # no temporary left
    stamp = os.stat(fresh_build / built[0]).st_mtime_ns
    native.library.cache_clear()
    assert native.library() is not None and os.stat(fresh_build / built[0]).st_mtime_ns == stamp


@pytest.mark.parametrize("compiler", ["false", "/nonexistent/cc"])
def test_without_a_compiler_the_data_path_says_so_and_takes_numpys(fresh_build, monkeypatch, caplog, compiler):
    from megatron_neobert.data.datasets.packing import pack_starts
    monkeypatch.setenv("CC", compiler)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.library() is None
        lengths = numpy.array([3, 700, 1, 2, 90, 1500], numpy.int32)
        starts = pack_starts(lengths, 64, numpy.array([5, 0, 2, 1, 4, 3]))
        shuffled = numpy.arange(10)
        native.shuffle(numpy.random.default_rng(1), shuffled)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "the data path's C helpers could not be built"]  # said once, for both
    assert compiler in caplog.records[0].getMessage()
    assert not os.path.exists(fresh_build) or not os.listdir(fresh_build)
    want = numpy.arange(10)
    numpy.random.default_rng(1).shuffle(want)
    assert numpy.array_equal(shuffled, want)
    native.library.cache_clear()
    monkeypatch.delenv("CC")
    again = pack_starts(lengths, 64, numpy.array([5, 0, 2, 1, 4, 3]))
    assert numpy.array_equal(starts.position, again.position) and numpy.array_equal(starts.offset, again.offset)
