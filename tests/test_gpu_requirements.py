"""tests/gpu on a machine without a GPU: its tests skip, and fail instead for the kernels REQUIRE_GPU_KERNELS lists."""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests would run here"),
              pytest.mark.integration]  # pytest on tests/gpu in a subprocess
GPU_TESTS = os.path.join(os.path.dirname(__file__), "gpu")


def run_gpu_tests(require: str):
    env = dict(os.environ, REQUIRE_GPU_KERNELS=require)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                           os.path.join(GPU_TESTS, "test_te_spec.py"), os.path.join(GPU_TESTS, "test_fp8_step.py")],
                          env=env, capture_output=True, text=True, timeout=300)


def test_absent_kernels_skip_unless_required():
    free = run_gpu_tests("")
    assert free.returncode == 0 and "SKIPPED" in free.stdout and "needs te:" in free.stdout, free.stdout
    required = run_gpu_tests("te")
    assert required.returncode == 1, required.stdout
    assert "REQUIRE_GPU_KERNELS lists te, but the test skipped: needs te:" in required.stdout
    # Only the listed kernel fails: the FP8 test skips for want of FP8 tensor cores.
    assert "SKIPPED [2] " in required.stdout and "needs fp8:" in required.stdout


def test_unknown_kernel_names_are_refused():
    result = run_gpu_tests("te,flash-attn")
    assert result.returncode != 0 and "REQUIRE_GPU_KERNELS: unknown flash-attn" in result.stdout + result.stderr
