"""The trainer on one GPU in bf16 (the quickstart's settings, shortened): the loss falls, packed and padded."""

import math

import pytest

from megatron_neobert.parallel.launch import run_on_ranks
from gpu_cases import needs_gpu
from pretrain_cases import run_train, tiny_argv

pytestmark = [needs_gpu, pytest.mark.integration]

PACKINGS = ("--packed", "--no-packed")


def train_each(argvs: list) -> list:
    """The trainer's history of each run, one after the other in this process (one start of Python and CUDA)."""
    return [run_train(argv) for argv in argvs]


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """{packing: (the run's history, its checkpoint folder)}."""
    folders = {packing: tmp_path_factory.mktemp("ckpt") for packing in PACKINGS}
    argvs = [tiny_argv(*data, "--bf16", packing, "--train-iters", "40", "--global-batch-size", "16",
                       "--save", str(folders[packing]), "--save-interval", "20") for packing in PACKINGS]
    histories = run_on_ranks(train_each, 1, argvs)[0]
    return {packing: (history, folders[packing]) for packing, history in zip(PACKINGS, histories)}


@pytest.mark.parametrize("packing", PACKINGS)
def test_bf16_training_on_one_gpu(runs, packing):
    history, folder = runs[packing]
    losses = [r["loss"] for r in history["train"]]
    assert history["exit"] == "finished" and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert (folder / "latest_checkpointed_iteration.txt").read_text().strip() == "40"
