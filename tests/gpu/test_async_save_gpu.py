"""--async-save on a GPU through nvidia-resiliency-ext, the writer megatron-core 0.19 uses where it imports (NGC's
images from 26.06): every checkpoint sealed and named by the marker once written, and a resume from one goes on as
the run went on. The CPU suite covers megatron-core's own writer on both releases (tests/test_faults.py,
tests/test_megatron_flags.py); this is the path the CPU machines cannot install (its wheels need glibc 2.39)."""

import math
import os

import pytest

from megatron_neobert.megatron_core_compat import async_save_strategy
from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.checkpoint.integrity import MANIFEST
from megatron_neobert.checkpoint.layout import iteration_dir, read_latest_iteration
from gpu_cases import GPU, needs
from pretrain_cases import run_train, tiny_argv

pytestmark = [needs("nvrx", GPU and async_save_strategy() == "nvrx",
                    "a GPU, megatron-core 0.19 and nvidia-resiliency-ext"), pytest.mark.integration]

# bf16 kernels that accumulate in no fixed order move a resumed run's losses by ~1e-2 at most (as in
# test_trainer_options_gpu.py); a resume from a wrong or half-written state would be off by far more.
NOISE = 0.1


def test_async_saves_through_nvidia_resiliency_ext_seal_and_resume(data, tmp_path):
    prefix, cache = data
    root = str(tmp_path / "ckpt")

    def argv(*extra):
        return tiny_argv(prefix, cache, "--bf16", "--log-interval", "1", "--train-iters", "6", *extra)

    (run,) = run_on_ranks(run_train, 1, argv("--save", root, "--save-interval", "2", "--async-save"))
    assert run["exit"] == "finished" and read_latest_iteration(root) == 6
    for iteration in (2, 4, 6):
        assert os.path.isfile(os.path.join(iteration_dir(root, iteration), MANIFEST)), iteration
    (resumed,) = run_on_ranks(run_train, 1, argv("--load", root, "--ckpt-step", "4",
                                                 "--save", str(tmp_path / "resumed")))
    went_on = [r["loss"] for r in run["train"] if r["iteration"] > 4]
    again = [r["loss"] for r in resumed["train"]]
    assert len(again) == 2 and all(math.isfinite(x) for x in again)
    assert max(abs(a - b) for a, b in zip(again, went_on)) < NOISE, (again, went_on)
