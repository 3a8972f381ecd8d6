"""The checks the GPU tests assert with (tests/execution_checks.py), shown failing on a CPU where a GPU run would
fail: the FP8 check on a model whose linears ran without FP8, the packed-kernel check on a model that ran another
kernel than the one compared, the sync check on a step with an `.item()` planted in its forward. On a CPU the
profiler records no CUDA runtime call, so the sync check finds the operators that read a device value on the host
(where a GPU would sync) rather than the runtime calls; its reading of the runtime calls' names is checked on the
names CUPTI gives them."""

import pytest
import torch

from execution_checks import (LAYER_LINEARS, PLANTED_ITEM, PLANTED_TOLIST, LinearPrecisions, assert_linears_ran,
                              assert_packed_kernel_ran, packed_kernels, planted_host_reads, profiled_step, runtime_call)
from megatron_neobert.evaluation.throughput import mlm_batch
from megatron_neobert.model import resolve_model_shape
from megatron_neobert.model.attention import PACKED_ATTENTION_ENV
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.training.engine.model_setup import setup_model_and_optimizer
from megatron_neobert.training.engine.forward_step import run_micro_batches

pytestmark = pytest.mark.usefixtures("cpu_execution")

SHAPE = resolve_model_shape("neobert-tiny", dict(num_layers=2, hidden_size=64, num_attention_heads=4,
                                                  ffn_hidden_size=128, vocab_size=512))
ARCH = SHAPE.arch
SEQ, MICRO_BATCH = 32, 2


def trainer_chunks(*flags):
    """This process's model chunks as the trainer sets them up (DDP, optimizer hooks), on the local spec."""
    settings = parse_settings(["--mock-data", "--micro-batch-size", str(MICRO_BATCH), "--seq-length", str(SEQ),
                               "--lr-warmup-iters", "0", "--transformer-impl", "local", *flags])
    _, chunks, _, _ = setup_model_and_optimizer(settings, SHAPE)
    return chunks


def micro_batches(packed: bool, count: int = 2):
    return [mlm_batch([SEQ // 2, SEQ], SEQ, ARCH.vocab_size, packed, mask_rate=0.3, seed=i) for i in range(count)]


def test_the_fp8_check_trips_on_a_model_whose_linears_ran_without_fp8():
    chunks = trainer_chunks()
    precisions = LinearPrecisions(chunks)
    run_micro_batches(chunks, micro_batches(packed=False), forward_only=True)
    ran = precisions.remove()
    assert len(ran) == len(LAYER_LINEARS) * ARCH.num_layers
    with pytest.raises(AssertionError) as err:
        assert_linears_ran(ran, fp8=True)
    message = str(err.value)
    assert message.startswith("8 of the 8 transformer-layer linears did not run in FP8: ")
    assert "decoder.layers.1.mlp.linear_fc2 (RowParallelLinear) ran without FP8" in message
    assert_linears_ran(ran, fp8=False)  # the bf16 run's assertion holds


def test_the_fp8_check_trips_on_linears_that_never_ran():
    ran = LinearPrecisions(trainer_chunks()).remove()
    with pytest.raises(AssertionError, match="linear_qkv \\(ColumnParallelLinear\\) never ran"):
        assert_linears_ran(ran, fp8=False)
    with pytest.raises(ValueError, match="no transformer-layer linear"):
        LinearPrecisions([torch.nn.Linear(4, 4)])


def kernels_run(chunks, packed: bool = True) -> dict:
    with packed_kernels(chunks) as ran, torch.no_grad():  # FlexAttention has no backward on a CPU
        run_micro_batches(chunks, micro_batches(packed), forward_only=True)
    return ran


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # CPU: uncompiled
def test_the_packed_kernel_check_trips_on_a_model_that_ran_another_kernel(monkeypatch):
    # tests/gpu/test_attention_kernels.py once built its model and then set the variable: both sides ran one kernel.
    monkeypatch.setenv(PACKED_ATTENTION_ENV, "sdpa")
    chunks = trainer_chunks()
    monkeypatch.setenv(PACKED_ATTENTION_ENV, "flex")
    ran = kernels_run(chunks)
    with pytest.raises(AssertionError) as err:
        assert_packed_kernel_ran(ran, "flex", ARCH.num_layers)
    assert str(err.value).startswith("2 of 2 attention modules ran packed input, expected all with flex: "
                                     "module.decoder.layers.0.self_attention.core_attention ran sdpa; "), err.value
    assert_packed_kernel_ran(ran, "sdpa", ARCH.num_layers)
    # A model built under the variable runs its kernel; padded input runs none (no packed forward).
    assert_packed_kernel_ran(kernels_run(trainer_chunks()), "flex", ARCH.num_layers)
    with pytest.raises(AssertionError, match="^0 of 2 attention modules ran packed input"):
        assert_packed_kernel_ran(kernels_run(chunks, packed=False), "sdpa", ARCH.num_layers)


@pytest.mark.parametrize("packed", [False, True])
def test_the_sync_check_finds_an_item_planted_in_the_forward(packed):
    chunks = trainer_chunks()
    batches = micro_batches(packed)
    clean = profiled_step(chunks, batches)
    assert clean.runtime_calls == 0 and clean.syncs == []  # a CPU profile; the step itself reads no value

    layer = dict(chunks[0].named_modules())["module.decoder.layers.0"]
    with planted_host_reads(layer):
        report = profiled_step(chunks, batches)
    assert len(report.syncs) == len(batches), report.syncs  # one per micro-batch's forward
    for sync in report.syncs:
        assert sync.startswith(f"aten::_local_scalar_dense < aten::item < {PLANTED_ITEM} < module: "
                               "module.decoder.layers.0 < module: module.decoder < module: module < "
                               "module: DistributedDataParallel"), sync
    # The .tolist() reads a host tensor here: only a GPU profile shows it (tests/gpu/test_sync_free_step.py).
    assert not any(PLANTED_TOLIST in sync for sync in report.syncs)


@pytest.mark.parametrize("name, call", [
    ("cudaStreamSynchronize", "cudaStreamSynchronize"), ("cudaStreamSynchronize_ptsz", "cudaStreamSynchronize"),
    ("cudaDeviceSynchronize_v3020", "cudaDeviceSynchronize"), ("cudaMemcpy_ptds", "cudaMemcpy"),
    ("cuLaunchKernelEx", "cuLaunchKernelEx"), ("cuLaunchKernel", "cuLaunchKernel"),
    ("cudaMemcpyAsync", "cudaMemcpyAsync"), ("aten::item", None), ("cutlass::Kernel2", None), ("cudnn", None),
])
def test_runtime_calls_are_read_from_cuptis_names(name, call):
    assert runtime_call(name) == call
