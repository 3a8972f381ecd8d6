"""`--profile` on one rank in this process: the window of steps it records, the trace it writes and the ranks it
runs on (a 2-rank run under the trainer is in test_pretrain.py)."""

import json
import logging

import pytest
import torch

from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.errors import InputError
from megatron_neobert.training.reporting.profiling import StepProfiler


def profiler(tmp_path, *flags):
    return StepProfiler(parse_settings(["--mock-data", "--train-iters", "10", "--lr-warmup-iters", "0",
                                    "--tensorboard-dir", str(tmp_path), *flags]))


def run_steps(profiler, first, last):
    """Steps first..last (iterations completed before each: first-1 .. last-1), a matrix product each."""
    for iteration in range(first, last + 1):
        profiler.step_begins(iteration - 1)
        torch.ones(16, 16) @ torch.ones(16, 16)
        profiler.step_ends(iteration)


def traced_steps(path):
    events = json.loads(path.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::mm" in names
    return sorted(n for n in names if n and n.startswith("ProfilerStep#"))


def test_the_window_holds_the_steps_after_the_start_to_the_end(single_rank, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="megatron_neobert")
    prof = profiler(tmp_path, "--profile", "--profile-step-start", "2", "--profile-step-end", "4")
    run_steps(prof, 1, 6)
    assert [p.name for p in tmp_path.iterdir()] == ["rank0_steps3-4.pt.trace.json"]
    assert traced_steps(tmp_path / "rank0_steps3-4.pt.trace.json") == ["ProfilerStep#0", "ProfilerStep#1"]
    printed = caplog.text
    assert printed.count("profile of steps 3-4 on rank 0: trace ") == 1
    assert "top 15 operators by self cpu time" in printed and "aten::mm" in printed


def test_a_run_stopped_inside_the_window_writes_the_steps_it_took(single_rank, tmp_path):
    prof = profiler(tmp_path, "--profile", "--profile-step-start", "1", "--profile-step-end", "8")
    run_steps(prof, 1, 3)
    prof.stop()
    assert [p.name for p in tmp_path.iterdir()] == ["rank0_steps2-3.pt.trace.json"]
    prof.stop()  # again, as the loop's clean-up does after an early stop: nothing more
    assert len(list(tmp_path.iterdir())) == 1


def test_a_run_resumed_past_the_start_profiles_nothing(single_rank, tmp_path):
    prof = profiler(tmp_path, "--profile", "--profile-step-start", "2", "--profile-step-end", "4")
    run_steps(prof, 4, 6)
    prof.stop()
    assert list(tmp_path.iterdir()) == []


def test_only_the_profiled_ranks_record_and_they_must_exist(single_rank, tmp_path):
    window = ["--profile-step-start", "1", "--profile-step-end", "2"]
    assert not profiler(tmp_path, *window).enabled  # without --profile
    with pytest.raises(InputError, match=r"--profile-ranks \[0, 1\]: this run has ranks 0 to 0"):
        profiler(tmp_path, "--profile", *window, "--profile-ranks", "0", "1")
