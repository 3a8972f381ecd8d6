"""Transformer Engine's layer spec against the local one, for the same weights (bf16)."""

import pytest
import torch

from megatron_neobert.training.engine.forward_step import model_inputs
from gpu_cases import batch, build, copy_local_to_te, loss_and_grads, needs_te, relative_error, te_key

pytestmark = needs_te


@pytest.fixture
def models(single_rank):
    local = build("local")
    te = build("transformer_engine", seed=1)
    copy_local_to_te(local, te)
    return local, te


@pytest.mark.parametrize("packed", [False, True])
def test_te_and_local_specs_agree_on_logits_and_gradients(models, packed):
    local, te = models
    inputs = model_inputs(batch(packed))
    no_labels = {k: v for k, v in inputs.items() if k not in ("labels", "masked_positions", "num_masked")}
    with torch.no_grad():
        te_logits, local_logits = te(**no_labels), local(**no_labels)
    # Padded positions' outputs are undefined: TE's padding mask also masks padded queries (their rows
    # come out zero), the local spec masks keys only. Packed input has none.
    real = inputs.get("attention_mask")
    if real is not None:
        te_logits, local_logits = te_logits[real], local_logits[real]
    assert relative_error(te_logits, local_logits) < 2e-2
    local_loss, local_grads = loss_and_grads(local, inputs)
    te_loss, te_grads = loss_and_grads(te, inputs)
    assert relative_error(te_loss, local_loss) < 2e-2
    for name, grad in local_grads.items():
        assert relative_error(te_grads[te_key(name)], grad) < 5e-2, name


def test_te_padded_input_without_a_mask_runs(models):
    """TE's padding-mask attention needs a mask: the model makes one when none is given."""
    local, te = models
    ids = batch(False)["tokens"].cuda()
    with torch.no_grad():
        assert relative_error(te(ids), local(ids)) < 2e-2


def test_te_packed_documents_equal_each_document_padded(models):
    _, te = models
    packed = batch(True)
    inputs = model_inputs(packed)
    with torch.no_grad():
        logits = te(inputs["input_ids"], packed_seq_params=inputs["packed_seq_params"])[0]
        cu = packed["cu_seqlens"].tolist()
        for start, end in zip(cu, cu[1:]):
            ids = torch.zeros(1, 128, dtype=torch.long, device="cuda")
            ids[0, :end - start] = inputs["input_ids"][0, start:end]
            mask = torch.arange(128, device="cuda")[None] < end - start
            alone = te(ids, attention_mask=mask)[0, :end - start]
            assert relative_error(logits[start:end], alone) < 2e-2, (start, end)
