"""README's first command, examples/quickstart.sh, end to end on short runs: as a cluster shell would run it
(MASTER_PORT exported, so the lone conversion process must not wait for a rendezvous), with a run shorter than
the default warmup, with extra trainer flags passed through, and bit-reproducible: two runs in two folders give
the same losses, checkpoints (every tensor, optimizer and RNG states included) and exported weights
(tests/quickstart_fingerprint.py)."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from quickstart_fingerprint import fingerprint, run_quickstart

pytestmark = pytest.mark.integration


def test_two_short_runs_with_exported_master_port_and_extra_flags_are_whole_and_bit_identical(tmp_path):
    # The two runs at once, each on its own port: much of a run is waiting (the rendezvous, a rank's start beside
    # the other's), and the runs share nothing but the sample files they read.
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda name: run_quickstart(tmp_path / name, 12, "--save-interval", "6"), ("one", "two")))
    prints = []
    for name, out in zip(("one", "two"), runs):
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "12 steps (1 warmup)" in out.stdout  # 30 warmup steps would not fit in 12
        assert "saved checkpoint at iteration 6" in out.stdout  # the extra flag reached the trainer
        # Each step says which kernels run in its kernels line, nothing else of them: neither megatron-core's import
        # warnings about the GPU extensions it lacks nor torch's about a missing CUDA runtime (a CUDA build of torch).
        said = out.stdout + out.stderr
        assert "are not installed" not in said and "No CUDA runtime" not in said, said[-3000:]
        qs = tmp_path / name / "qs"
        assert (qs / "hf" / "model.safetensors").is_file() and (qs / "hf" / "vocab.txt").is_file()
        assert (qs / "pseudo_perplexity.csv").is_file()
        # The watcher's --once line scored both checkpoints (iterations 6 and 12) for its pseudo-perplexity buckets.
        results = (qs / "checkpoints" / "downstream" / "downstream.jsonl").read_text().splitlines()
        assert sorted((row["iteration"], row["task"]) for row in map(json.loads, results)) == \
            [(i, f"pppl/len_{n}") for i in (6, 12) for n in (128, 64)]
        prints.append(fingerprint(qs))
    first, second = prints
    # what is compared: the loss of each step, both checkpoints, the export
    assert sum(key.startswith("curve/lm loss/") for key in first) == 12
    assert {key.split("/")[1] for key in first if key.startswith("checkpoint/")} == {"iter_0000006", "iter_0000012"}
    assert "export/decoder.weight" in first
    differ = sorted(key for key in first.keys() | second.keys() if first.get(key) != second.get(key))
    assert not differ, f"{len(differ)} of {len(first)} items differ between the runs, first: {differ[:10]}"


def test_too_short_a_run_fails_before_anything_runs(tmp_path):
    for bad in ("1", "ten"):
        out = run_quickstart(tmp_path, bad)
        assert out.returncode == 2 and f"TRAIN_ITERS={bad}: give a whole number of steps, at least 2" in out.stderr
    assert not (tmp_path / "qs").exists()
