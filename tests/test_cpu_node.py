"""A node without GPUs, with a CUDA build of torch (a login node, a CPU job in the GPU container; PyPI's torch for
Linux on CPython 3.12): converting, exporting, watching, evaluating and benchmarking run on the CPU without any
variable, their kernels line saying so; the trainer refuses in one line, naming the variable that allows it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_neobert.data.assets import SAMPLE_CORPUS
from megatron_neobert.parallel.launch import ALLOW_CPU_ENV
from pretrain_cases import tiny_argv
from test_watch import write_suite

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.version.cuda is None, reason="a CPU build of torch trains on the CPU: the case is a CUDA "
                       "build that sees no GPU (CI's CPython 3.12 lane)"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),
]


def without_the_variable(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (ALLOW_CPU_ENV, "RANK", "LOCAL_RANK")}
    return dict(env, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO)] + sys.path), **extra)


def run(*argv, cwd, env=None, timeout=600):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, env=env or without_the_variable(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """A 4-step run's checkpoints, trained where the variable allows the CPU."""
    root = tmp_path_factory.mktemp("cpu_node")
    save = root / "ckpt"
    out = run("-m", "megatron_neobert.pretrain", *tiny_argv(*data, "--train-iters", "4", "--save", save,
                                                            "--save-interval", "4"),
              cwd=root, env=without_the_variable(**{ALLOW_CPU_ENV: "1"}))
    assert out.returncode == 0, out.stderr[-3000:]
    return root, save


def test_the_trainer_refuses_in_one_line_before_any_rank_works(data, tmp_path):
    out = run("-m", "megatron_neobert.pretrain", *tiny_argv(*data, "--train-iters", "4"), cwd=tmp_path, timeout=300)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no GPU "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): was the container started "
        f"with GPUs? To train on the CPU anyway, set {ALLOW_CPU_ENV}=1"], out.stderr


def test_conversion_both_ways_the_watcher_and_evaluation_run_on_the_cpu(trained):
    root, save = trained
    hf = root / "hf"
    export = run(REPO / "tools" / "convert_checkpoint.py", "--direction", "mcore-to-hf", "--load", save, "--save", hf,
                 "--no-progress", cwd=root)
    assert export.returncode == 0, export.stderr[-3000:]
    assert "kernels: device: CPU" in export.stderr and (hf / "model.safetensors").is_file()
    # Back on 2 ranks, which set up a process group of their own.
    back = run(REPO / "tools" / "convert_checkpoint.py", "--direction", "hf-to-mcore", "--load", hf, "--save",
               root / "mcore_tp2", "--tensor-model-parallel-size", "2", "--no-progress", cwd=root)
    assert back.returncode == 0, back.stderr[-3000:]
    assert back.stderr.count("kernels: device: CPU") == 1 and (root / "mcore_tp2").is_dir()

    pppl = run(REPO / "tools" / "pseudo_perplexity.py", "--model", hf, "--texts", SAMPLE_CORPUS, "--text-field",
               "content", "--num-texts", "2", "--max-length", "64", "--buckets", "32", "--device", "cpu",
               "--output", root / "pppl", "--no-progress", cwd=root)
    assert pppl.returncode == 0, pppl.stderr[-3000:]
    assert (root / "pppl.csv").is_file()
    # GLUE, MTEB on local task files and pseudo-perplexity, each on an export of the checkpoint: the watcher's suite.
    suite = write_suite(root)
    watch = run(REPO / "tools" / "watch_run.py", "--save", save, "--suite", suite, "--once", cwd=root)
    assert watch.returncode == 0, watch.stdout[-3000:] + watch.stderr[-3000:]
    assert "kernels: device: CPU" in watch.stdout + watch.stderr
    written = (save / "downstream" / "downstream.jsonl").read_text().splitlines()
    assert len(written) == 3  # glue/sst2, mteb/MySTS, pppl/len_64 at iteration 4
