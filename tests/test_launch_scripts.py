"""examples/cuda_env.sh, which the launch scripts source with the trainer's arguments: one CUDA hardware queue
(CUDA_DEVICE_MAX_CONNECTIONS=1) exactly when tensor parallelism is on, as megatron-core's TP overlap needs."""

import os
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def connections_after(*args):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    out = subprocess.run(["bash", "-c", 'source "$0" "$@"; echo "${CUDA_DEVICE_MAX_CONNECTIONS-unset}"',
                          str(EXAMPLES / "cuda_env.sh"), *args], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("args, expected", [
    ((), "unset"),
    (("--tensor-model-parallel-size", "1", "--bf16"), "unset"),
    (("--bf16", "--tensor-model-parallel-size", "2"), "1"),
    (("--tensor-model-parallel-size=8",), "1"),
    (("--tensor_model_parallel_size", "4"), "1"),  # the underscore spelling the trainer also reads
    (("--pipeline-model-parallel-size", "2"), "unset"),
])
def test_one_hardware_queue_exactly_with_tensor_parallelism(args, expected):
    assert connections_after(*args) == expected


@pytest.mark.parametrize("script", ["pretrain_neobert.sh", "pretrain_neobert_stage2.sh", "quickstart.sh"])
def test_launch_scripts_source_it_with_the_trainer_arguments_before_starting_ranks(script):
    text = (EXAMPLES / script).read_text()
    source = text.index('source "$(dirname "${BASH_SOURCE[0]}")/cuda_env.sh" "$@"')
    assert source < text.index("torchrun ")
