"""The straggler detector on a GPU: a rank's wait in the gradient reduction is the device's, timed by events on the
stream, and the step is not synchronised for it (the device would idle while the optimizer's kernels are launched)."""

import json
import time
import types

import torch

from gpu_cases import needs_gpu
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.training.resilience.guards.launcher import LauncherWatch
from megatron_neobert.training.resilience.guards.straggler import StragglerDetector

pytestmark = needs_gpu


def test_the_reductions_device_time_is_the_wait_and_the_step_is_not_synchronised(single_rank):
    operand = torch.randn(4096, 4096, device="cuda")

    def reduction():  # a stand-in for a reduction that waits on a slow peer: ~0.2 s of device work, queued at once
        for _ in range(60):
            operand @ operand

    config = types.SimpleNamespace(finalize_model_grads_func=reduction)
    detector = StragglerDetector(parse_settings(["--mock-data"]), config, None, None, LauncherWatch())
    operand @ operand  # cuBLAS' first call (its set-up) outside the timing
    torch.cuda.synchronize()
    began = time.perf_counter()
    config.finalize_model_grads_func()
    assert not torch.cuda.current_stream().query(), "the wrapped reduction synchronised the device"
    torch.cuda.synchronize()
    step_s = time.perf_counter() - began
    detector.interval_end(1, 1, step_s, 0.0)
    compute_s, _, _ = json.loads(detector.store.get("1/0"))
    print(f"a step of {step_s * 1000:.1f} ms, of which the wait in the reduction left {compute_s * 1000:.1f} ms of "
          f"compute")
    assert step_s > 0.05 and 0 <= compute_s < 0.1 * step_s
