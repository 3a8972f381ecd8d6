"""The trainer on one GPU in bf16 (the quickstart's settings, shortened): the loss falls, packed and padded."""

import math

import pytest

from megatron_neobert.parallel.launch import run_on_ranks
from gpu_cases import needs_gpu
from pretrain_cases import run_train, tiny_argv

pytestmark = [needs_gpu, pytest.mark.integration]


@pytest.mark.parametrize("packing", ["--packed", "--no-packed"])
def test_bf16_training_on_one_gpu(data, tmp_path, packing):
    prefix, cache = data
    argv = tiny_argv(prefix, cache, "--bf16", packing, "--train-iters", "40", "--global-batch-size", "16",
                     "--save", str(tmp_path / "ckpt"), "--save-interval", "20")
    history = run_on_ranks(run_train, 1, argv)[0]
    losses = [r["loss"] for r in history["train"]]
    assert history["exit"] == "finished" and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "40"
