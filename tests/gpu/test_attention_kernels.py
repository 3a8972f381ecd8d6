"""The packed attention kernels of the local spec on a GPU against segmented SDPA: forward and backward. Each model is
built for its kernel (the kernel is fixed when the model is built) and each is checked to have run it, so that the
test cannot compare a kernel with itself (tests/test_execution_checks.py shows the check failing on a CPU)."""

import pytest

from execution_checks import assert_packed_kernel_ran, packed_kernels
from megatron_neobert.model.attention import flash_attn_varlen
from megatron_neobert.training.engine.forward_step import model_inputs
from gpu_cases import ARCH, batch, build, loss_and_grads, needs, needs_gpu, relative_error

pytestmark = needs_gpu


def run_with(kernel: str, inputs):
    """Loss and gradients of a local-spec model built for `kernel` (seed 0: the same weights for every kernel), having
    checked that every attention module ran it."""
    model = build("local", packed_kernel=kernel)
    with packed_kernels([model]) as ran:
        result = loss_and_grads(model, inputs)
    assert_packed_kernel_ran(ran, kernel, ARCH.num_layers)
    return result


@pytest.mark.parametrize("kernel", [
    "flex",
    pytest.param("flash", marks=needs("flash", flash_attn_varlen() is not None, "flash-attn")),
])
def test_packed_kernel_equals_sdpa(single_rank, kernel):
    inputs = model_inputs(batch(True))
    reference_loss, reference_grads = run_with("sdpa", inputs)
    loss, grads = run_with(kernel, inputs)
    assert relative_error(loss, reference_loss) < 2e-2
    for name, grad in reference_grads.items():
        assert relative_error(grads[name], grad) < 5e-2, name
