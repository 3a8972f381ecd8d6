"""The packed attention kernels of the local spec on a GPU against segmented SDPA: forward and backward."""

import pytest

from megatron_neobert.model.attention import PACKED_ATTENTION_ENV, flash_attn_varlen
from megatron_neobert.training.step import model_inputs
from gpu_cases import batch, build, needs, needs_gpu, relative_error

pytestmark = needs_gpu


def loss_and_grads(model, inputs):
    model.zero_grad()
    loss, _ = model(**inputs)
    loss.sum().backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kernel", [
    "flex",
    pytest.param("flash", marks=needs("flash", flash_attn_varlen() is not None, "flash-attn")),
])
def test_packed_kernel_equals_sdpa(single_rank, monkeypatch, kernel):
    model = build("local")
    inputs = model_inputs(batch(True))
    monkeypatch.setenv(PACKED_ATTENTION_ENV, "sdpa")
    reference_loss, reference_grads = loss_and_grads(model, inputs)
    monkeypatch.setenv(PACKED_ATTENTION_ENV, kernel)
    loss, grads = loss_and_grads(model, inputs)
    assert relative_error(loss, reference_loss) < 2e-2
    for name, grad in reference_grads.items():
        assert relative_error(grads[name], grad) < 5e-2, name
