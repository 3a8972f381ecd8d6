"""The CPU fallback: automatic only for a CPU build of torch."""

import pytest
import torch

from megatron_neobert.parallel.launch import ALLOW_CPU_ENV, check_cpu_fallback


def test_a_cuda_build_without_a_gpu_fails_unless_cpu_is_asked_for(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    monkeypatch.delenv(ALLOW_CPU_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(RuntimeError, match=f"CUDA 12.9 but sees no GPU.*CUDA_VISIBLE_DEVICES=7.*{ALLOW_CPU_ENV}=1"):
        check_cpu_fallback()
    monkeypatch.setenv(ALLOW_CPU_ENV, "1")
    check_cpu_fallback()


def test_a_cpu_build_runs_on_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.delenv(ALLOW_CPU_ENV, raising=False)
    check_cpu_fallback()
