"""NeoBERT as a transformers-native model: its files are the modular converter's output, its forward reads no
tensor value on the host, and fine-tuning in reduced precision stays finite (padded and packed, random and
converted weights)."""

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from megatron_neobert.hf import NeoBERT, NeoBERTConfig, NeoBERTForSequenceClassification

import hf_modular


def tiny(**overrides):
    args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72, vocab_size=97,
                max_length=64, classifier_dropout=0.0)
    args.update(overrides)
    return NeoBERTConfig(**args)


def test_generated_files_are_the_modular_converters_output():
    """configuration_neobert.py and modeling_neobert.py are what transformers' modular converter makes of
    modular_neobert.py (their relative transformers imports made absolute, the only change)."""
    try:
        with tempfile.TemporaryDirectory() as work:
            files = hf_modular.generated_files(Path(work))
    except hf_modular.ConverterUnavailable as why:
        pytest.skip(str(why))
    assert sorted(files) == sorted(hf_modular.GENERATED)
    for name, code in files.items():
        assert (hf_modular.HF_DIR / name).read_text(encoding="utf-8") == code, (
            f"{name} is not the converter's output: run `python tests/hf_modular.py --write`")


def test_generated_files_record_the_current_modular_file():
    """Without the converter (CI has none): each generated file records the SHA-256 of the modular file it was
    generated from, which must be the current one's."""
    assert hf_modular.drift() == []


def test_an_edited_modular_file_is_drift(tmp_path):
    """The check above fails once the modular file changes without its generated files."""
    for name in (hf_modular.MODULAR.name, *hf_modular.GENERATED):
        shutil.copyfile(hf_modular.HF_DIR / name, tmp_path / name)
    assert hf_modular.drift(tmp_path) == []
    with open(tmp_path / hf_modular.MODULAR.name, "a", encoding="utf-8") as modular:
        modular.write("\n# an edit\n")
    stale = hf_modular.drift(tmp_path)
    print("\n".join(stale))
    assert [line.split()[0] for line in stale] == list(hf_modular.GENERATED)
    assert all(hf_modular.modular_hash(tmp_path / hf_modular.MODULAR.name) in line for line in stale)


# ------------------------------------------------------------------------------------------------
# No host read in forward
# ------------------------------------------------------------------------------------------------


def packed_inputs(lengths, total):
    ids = torch.randint(1, 97, (1, total), generator=torch.Generator().manual_seed(0))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return ids, dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_forward_compiles_as_one_graph(layout, attn_implementation):
    """torch.compile(fullgraph=True) refuses any graph break, and a read of a tensor's value on the host
    (`.item()`, `bool(tensor)`, data-dependent control flow) is one: forward has none, padded or packed."""
    torch.manual_seed(0)
    model = NeoBERT(tiny(_attn_implementation=attn_implementation)).eval()
    if layout == "padded":
        ids = torch.randint(1, 97, (3, 12), generator=torch.Generator().manual_seed(0))
        kwargs = dict(attention_mask=(torch.arange(12) < torch.tensor([[12], [7], [3]])).long())
    else:
        ids, kwargs = packed_inputs([5, 9, 3], 20)  # 3 tokens of pack padding after the documents
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        eager = model(ids, **kwargs).last_hidden_state
        traced = compiled(ids, **kwargs).last_hidden_state
    torch.testing.assert_close(traced, eager)


# ------------------------------------------------------------------------------------------------
# Reduced-precision fine-tuning
# ------------------------------------------------------------------------------------------------

STEPS = 4


def converted_state_dict(config):
    """The weights of a megatron-core NeoBERT of the same shape, mapped to the published layout."""
    from megatron_neobert.conversion.convert import build_single_rank_model
    from megatron_neobert.conversion.shape_bridge import arch_for_hf_config
    from megatron_neobert.conversion.state_dict_mapping import hf_state_dict_from_mcore
    from megatron_neobert.model import padded_vocab_size

    arch = arch_for_hf_config(config)
    torch.manual_seed(1)
    model = build_single_rank_model(arch, padded_vocab_size(arch.vocab_size))
    with torch.no_grad():  # megatron-core builds without init here: draw the recipe's uniform init
        for p in model.parameters():
            p.uniform_(-0.2, 0.2) if p.dim() > 1 else p.uniform_(0.8, 1.2)
    state = {k: v for k, v in model.state_dict().items() if "_extra_state" not in k}
    return {k[len("model."):]: v for k, v in hf_state_dict_from_mcore(state, config).items() if k.startswith("model.")}


def classification_batch(layout):
    """Four sequences of lengths 9, 4, 12, 6 with labels: padded [4, 12], or packed into one row of 31 tokens
    plus 2 of pack padding."""
    g = torch.Generator().manual_seed(2)
    lengths, labels = [9, 4, 12, 6], torch.tensor([0, 1, 2, 1])
    seqs = [torch.randint(1, 97, (n,), generator=g) for n in lengths]
    if layout == "padded":
        ids = torch.zeros(4, 12, dtype=torch.long)
        mask = torch.zeros(4, 12, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)], mask[i, :len(s)] = s, 1
        return dict(input_ids=ids, attention_mask=mask, labels=labels)
    ids = torch.cat([*seqs, torch.zeros(2, dtype=torch.long)])[None]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return dict(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=12, max_length_k=12, labels=labels)


def fine_tune(weights, layout, precision):
    """(loss at each step, every gradient finite) of STEPS AdamW steps of sequence classification."""
    torch.manual_seed(3)
    model = NeoBERTForSequenceClassification(tiny(num_labels=3))
    if weights is not None:
        model.model.load_state_dict(weights, strict=False)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if precision == "fp16" else None
    batch = classification_batch(layout)
    losses, finite = [], True
    for _ in range(STEPS + 1):
        with torch.autocast("cpu", dtype={"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision),
                            enabled=precision != "fp32"):
            loss = model(**batch).loss
        losses.append(loss.item())
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        finite &= all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        (scaler.step(optimizer), scaler.update()) if scaler else optimizer.step()
        optimizer.zero_grad()
    return losses, finite


@pytest.mark.parametrize("weights", ["random", "converted"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_reduced_precision_fine_tuning_is_finite(single_rank, weights, layout):
    """bf16 autocast and fp16 autocast with a gradient scaler: finite losses and gradients at every step, and the
    first loss within half precision of fp32's (CPU autocast; the GPU suite runs the same function)."""
    state = converted_state_dict(tiny()) if weights == "converted" else None
    reference, _ = fine_tune(state, layout, "fp32")
    for precision, tolerance in (("bf16", 2e-2), ("fp16", 5e-3)):
        losses, finite = fine_tune(state, layout, precision)
        print(f"{precision} {layout} {weights}: loss {losses[0]:.4f} -> {losses[-1]:.4f} "
              f"(fp32 {reference[0]:.4f} -> {reference[-1]:.4f}), finite={finite}")
        assert finite and all(torch.isfinite(torch.tensor(losses)))
        assert losses[0] == pytest.approx(reference[0], rel=tolerance)
        assert losses[-1] < losses[0]  # it learns


def test_packed_classification_equals_padded(single_rank):
    """One label per document: a packed batch scores each document as the padded batch scores its row."""
    torch.manual_seed(0)
    model = NeoBERTForSequenceClassification(tiny(num_labels=3)).eval()
    with torch.no_grad():
        padded = model(**classification_batch("padded"))
        packed = model(**classification_batch("packed"))
    torch.testing.assert_close(packed.logits, padded.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.loss, padded.loss, atol=1e-5, rtol=1e-5)


def test_the_published_swiglu_rule_is_the_presets():
    """The standalone HF config (it must load without this package) reads the published config.json's nominal
    intermediate_size with its own copy of NeoBERT's SwiGLU rule; the presets' rule must give the same widths."""
    from megatron_neobert.hf.configuration_neobert import published_swiglu_width
    from megatron_neobert.model import PRESETS, swiglu_width

    assert all(swiglu_width(n) == published_swiglu_width(n) for n in range(1, 20000))
    assert PRESETS["neobert-250m"].ffn_hidden_size == published_swiglu_width(3072) == 2048
