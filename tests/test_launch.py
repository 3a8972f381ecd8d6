"""Training on the CPU: automatic only for a CPU build of torch; ranks on the CPU started as their caller would
spawn them."""

import os
import sys

import pytest
import torch
from rank_preload import TRAINER_AND_CONVERTER

from megatron_neobert.errors import TrainingError
from megatron_neobert.parallel.launch import ALLOW_CPU_ENV, check_gpus_for_training, run_on_ranks

WORD = "NEOBERT_TEST_LAUNCH_WORD"


def test_a_cuda_build_without_a_gpu_does_not_train_unless_cpu_is_asked_for(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(ALLOW_CPU_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(TrainingError, match=f"CUDA 12.9 but sees no GPU.*CUDA_VISIBLE_DEVICES=7.*{ALLOW_CPU_ENV}=1"):
        check_gpus_for_training()
    monkeypatch.setenv(ALLOW_CPU_ENV, "1")
    check_gpus_for_training()


def test_a_cpu_build_trains_on_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.delenv(ALLOW_CPU_ENV, raising=False)
    check_gpus_for_training()


def say_and_mark(leave_a_mark: bool):
    """What a rank sees: the caller's variable, and whether an earlier rank's change to a module is still there."""
    # One write a line: two ranks' lines must not interleave, however Python buffers (PYTHONUNBUFFERED).
    os.write(1, f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} says {os.environ.get(WORD)}\n".encode())
    os.write(2, f"rank {os.environ['RANK']} on stderr\n".encode())
    found = getattr(torch, "_neobert_mark", None)
    if leave_a_mark:
        torch._neobert_mark = os.getpid()
    return os.environ.get(WORD), found, os.getpid()


@pytest.mark.integration
def test_ranks_take_the_callers_environment_and_streams_and_nothing_of_earlier_ranks(monkeypatch, capfd):
    """On the CPU the ranks are forked from a server that started with the first call's environment and streams:
    each rank still sees the variables and writes to the streams of the call that starts it, and starts as clean as
    a spawned rank."""
    monkeypatch.setenv(WORD, "first")
    first = run_on_ranks(say_and_mark, 2, True)
    capfd.readouterr()
    monkeypatch.setenv(WORD, "second")
    second = run_on_ranks(say_and_mark, 2, False)
    print("the caller after its ranks", flush=True)  # written after theirs, not over them
    printed = capfd.readouterr()
    assert [(word, found) for word, found, _ in first] == [("first", None)] * 2
    assert [(word, found) for word, found, _ in second] == [("second", None)] * 2
    assert sorted(printed.out.splitlines()[:2]) == ["rank 0 of 2 says second", "rank 1 of 2 says second"]
    assert printed.out.splitlines()[2:] == ["the caller after its ranks"]
    assert sorted(printed.err.splitlines()) == ["rank 0 on stderr", "rank 1 on stderr"]
    assert len({pid for *_, pid in first + second} | {os.getpid()}) == 5


def imported_already(names):
    return [name in sys.modules for name in names]


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, ranks are spawned: each imports for itself")
def test_cpu_ranks_start_with_the_modules_their_callers_preload():
    """The trainer and the converter, named by conftest.py, were imported once by the server the ranks are forked
    from: a rank starts with them (this module imports neither) instead of spending seconds importing them."""
    assert run_on_ranks(imported_already, 2, TRAINER_AND_CONVERTER) == [[True, True]] * 2
