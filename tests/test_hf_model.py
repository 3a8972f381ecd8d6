"""Tests of megatron_neobert/hf/modeling_neobert.py against an independent plain-torch reference."""

import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from megatron_neobert.hf import modeling_neobert as mn
from megatron_neobert.hf import (
    NeoBERT,
    NeoBERTConfig,
    NeoBERTForSequenceClassification,
    NeoBERTForTokenClassification,
    NeoBERTLMHead,
)
from megatron_neobert.hf.modeling_neobert import NeoBERTRotaryEmbedding

VOCAB = 97
ATOL = 2e-5


def tiny_config(**kw):
    args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72, vocab_size=VOCAB,
                max_length=64, classifier_dropout=0.0)
    args.update(kw)
    return NeoBERTConfig(**args)


def random_official_state_dict(config, seed=0):
    """Random tensors under the published key names; norms around 1 so that they matter."""
    g = torch.Generator().manual_seed(seed)
    h, f, v = config.hidden_size, config.ffn_hidden_size, config.vocab_size

    def rnd(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    sd = {"model.encoder.weight": rnd(v, h, scale=1.0)}
    for i in range(config.num_hidden_layers):
        p = f"model.transformer_encoder.{i}."
        sd[p + "attention_norm.weight"] = 1 + rnd(h)
        sd[p + "qkv.weight"] = rnd(3 * h, h)
        sd[p + "wo.weight"] = rnd(h, h)
        sd[p + "ffn_norm.weight"] = 1 + rnd(h)
        sd[p + "ffn.w12.weight"] = rnd(2 * f, h)
        sd[p + "ffn.w3.weight"] = rnd(h, f)
    sd["model.layer_norm.weight"] = 1 + rnd(h)
    sd["decoder.weight"] = rnd(v, h)
    sd["decoder.bias"] = rnd(v)
    return sd


def load_model(cls, config, sd):
    """Builds `cls` and loads `sd` strictly (bare NeoBERT: unprefixed encoder keys; heads keep their own init)."""
    model = cls(config).eval()
    if cls is NeoBERT:
        sd = {k[len("model."):]: v for k, v in sd.items() if k.startswith("model.")}
    elif cls is not NeoBERTLMHead:
        sd = {**model.state_dict(), **{k: v for k, v in sd.items() if k.startswith("model.")}}
    model.load_state_dict(sd, strict=True)
    return model


# ------------------------------------------------------------------------------------------------
# Independent reference: the published math written out (complex RoPE, per-head weight split).
# ------------------------------------------------------------------------------------------------


def reference_forward(sd, config, ids, mask=None, positions=None):
    """Returns (last_hidden_state, logits). mask: [B, L] bool, True for real tokens."""
    nh, dh, H, F_ = config.num_attention_heads, config.dim_head, config.hidden_size, config.ffn_hidden_size
    B, L = ids.shape
    x = sd["model.encoder.weight"][ids]
    if positions is None:
        positions = torch.arange(L).expand(B, L)
    freqs = 1.0 / (config.rope_parameters['rope_theta'] ** (torch.arange(0, dh, 2).float() / dh))
    cis = torch.polar(torch.ones(B, L, dh // 2), positions[..., None].float() * freqs)  # [B, L, dh/2]

    def rms(t, w):
        return w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + config.norm_eps))

    def rope(t):  # [B, L, nh, dh]
        c = torch.view_as_complex(t.reshape(B, L, nh, dh // 2, 2))
        return torch.view_as_real(c * cis[:, :, None, :]).reshape(B, L, nh, dh)

    for i in range(config.num_hidden_layers):
        p = f"model.transformer_encoder.{i}."
        w = sd[p + "qkv.weight"].view(nh, 3, dh, H)  # head h owns rows h*3dh .. : [q_h; k_h; v_h]
        wq, wk, wv = (w[:, j].reshape(nh * dh, H) for j in range(3))
        a = rms(x, sd[p + "attention_norm.weight"])
        q, k, v = (rope((a @ wq.T).view(B, L, nh, dh)), rope((a @ wk.T).view(B, L, nh, dh)), (a @ wv.T).view(B, L, nh, dh))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / dh ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(B, L, H)
        x = x + o @ sd[p + "wo.weight"].T
        m = rms(x, sd[p + "ffn_norm.weight"])
        w12 = sd[p + "ffn.w12.weight"]
        gate, up = m @ w12[:F_].T, m @ w12[F_:].T
        x = x + (F.silu(gate) * up) @ sd[p + "ffn.w3.weight"].T
    x = rms(x, sd["model.layer_norm.weight"])
    return x, x @ sd["decoder.weight"].T + sd["decoder.bias"]


@pytest.fixture(scope="module")
def cfg():
    return tiny_config()


@pytest.fixture(scope="module")
def sd(cfg):
    return random_official_state_dict(cfg)


@pytest.fixture(scope="module")
def lm(cfg, sd):
    return load_model(NeoBERTLMHead, cfg, sd)


def sentences(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]


def pad(seqs, left=False):
    L = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(L - len(s), L) if left else slice(0, len(s))
        ids[i, sl], mask[i, sl] = s, 1
    return ids, mask


# ------------------------------------------------------------------------------------------------
# Layout of the published checkpoint
# ------------------------------------------------------------------------------------------------

OFFICIAL_250M = {  # the published checkpoint's tensors
    "model.encoder.weight": (30522, 768),
    "attention_norm.weight": (768,),
    "qkv.weight": (2304, 768),
    "wo.weight": (768, 768),
    "ffn_norm.weight": (768,),
    "ffn.w12.weight": (4096, 768),
    "ffn.w3.weight": (768, 2048),
    "model.layer_norm.weight": (768,),
    "decoder.weight": (30522, 768),
    "decoder.bias": (30522,),
}


def test_250m_layout_matches_published_checkpoint():
    with torch.device("meta"):
        lm = NeoBERTLMHead(NeoBERTConfig())
        base = NeoBERT(NeoBERTConfig())
    shapes = {k: tuple(v.shape) for k, v in lm.state_dict().items()}
    assert len(shapes) == 172
    for key, shape in shapes.items():
        short = key if key in OFFICIAL_250M else key.split(".", 3)[-1]
        if key.startswith("model.transformer_encoder."):
            assert int(key.split(".")[2]) < 28
        assert OFFICIAL_250M[short] == shape, key
    assert sum(p.numel() for p in lm.parameters()) == 245_136_954
    assert sum(p.numel() for p in lm.model.parameters()) == 221_665_536
    assert sum(p.numel() for p in base.parameters()) == 221_665_536
    assert {k for k in lm.state_dict() if k.endswith("bias")} == {"decoder.bias"}


def test_published_config_json_loads():
    official = {
        "architectures": ["NeoBERTLMHead"],
        "auto_map": {"AutoConfig": "model.NeoBERTConfig", "AutoModel": "model.NeoBERT",
                     "AutoModelForMaskedLM": "model.NeoBERTLMHead",
                     "AutoModelForSequenceClassification": "model.NeoBERTForSequenceClassification"},
        "classifier_init_range": 0.02, "decoder_init_range": 0.02, "dim_head": 64, "embedding_init_range": 0.02,
        "hidden_size": 768, "intermediate_size": 3072, "kwargs": {"classifier_dropout": 0.1},
        "max_length": 4096, "model_type": "neobert", "norm_eps": 1e-05, "num_attention_heads": 12,
        "num_hidden_layers": 28, "pad_token_id": 0, "torch_dtype": "float32", "vocab_size": 30522,
    }
    c = NeoBERTConfig.from_dict(official)
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.dim_head) == (768, 28, 12, 64)
    assert c.ffn_hidden_size == 2048 and c.intermediate_size == 3072
    assert c.norm_eps == 1e-5 and c.max_length == 4096 and c.vocab_size == 30522 and c.pad_token_id == 0
    assert c.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0} and c.classifier_dropout == 0.1
    assert c.tie_word_embeddings is False and (c.head_dim, c.max_position_embeddings) == (64, 4096)
    # transformers' RoPE parameters survive a serialisation round trip, and so does the real SwiGLU width
    c2 = NeoBERTConfig.from_dict(tiny_config(rope_parameters={"rope_type": "linear", "factor": 2.0}).to_dict())
    assert c2.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert NeoBERTConfig.from_dict(tiny_config(ffn_hidden_size=40).to_dict()).ffn_hidden_size == 40
    # the project's own exports of before (rope_theta at the top level) still load
    assert NeoBERTConfig.from_dict(dict(official, rope_theta=500.0)).rope_parameters["rope_theta"] == 500.0


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="divisible"):
        NeoBERTConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="dim_head must be even"):
        NeoBERTConfig(hidden_size=36, num_attention_heads=12)
    with pytest.raises(Exception, match="hidden_size"):
        NeoBERTConfig(hidden_size="big")


@pytest.mark.parametrize("remote_code", [False, True])
def test_published_layout_folder_loads_through_auto_class(tmp_path, cfg, sd, remote_code):
    """A folder in the published layout (auto_map -> model.*): without remote code, `import megatron_neobert.hf`
    has registered NeoBERT and the Auto class runs it; with remote code, the folder's own model.py (our generated
    files) runs. Both give the reference's logits."""
    from transformers import AutoModelForMaskedLM

    import megatron_neobert.hf  # noqa: F401  (the registration)

    official = {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads", "dim_head", "vocab_size", "pad_token_id",
                                             "norm_eps", "max_length", "embedding_init_range",
                                             "decoder_init_range", "classifier_init_range")}
    official.update(model_type="neobert", architectures=["NeoBERTLMHead"], torch_dtype="float32",
                    auto_map={"AutoConfig": "model.NeoBERTConfig", "AutoModel": "model.NeoBERT",
                              "AutoModelForMaskedLM": "model.NeoBERTLMHead",
                              "AutoModelForSequenceClassification": "model.NeoBERTForSequenceClassification"})
    (tmp_path / "config.json").write_text(json.dumps(official))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    if remote_code:
        shutil.copyfile(mn.__file__, tmp_path / "model.py")
        shutil.copyfile(mn.__file__.replace("modeling_neobert", "configuration_neobert"),
                        tmp_path / "configuration_neobert.py")

    ids, mask = pad(sentences([6, 11]))
    _, ref_logits = reference_forward(sd, cfg, ids, mask.bool())
    real = mask.bool()  # padded query slots are don't-care
    if remote_code:  # in a process that never imports megatron_neobert, so only the folder's code can run
        torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
        script = (
            "import sys, torch; from transformers import AutoModelForMaskedLM; folder = sys.argv[1]; "
            "model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval(); "
            "assert 'megatron_neobert' not in sys.modules and type(model).__module__.startswith('transformers_modules'); "
            "x = torch.load(folder + '/inputs.pt'); "
            "torch.save(model(input_ids=x['ids'], attention_mask=x['mask']).logits, folder + '/logits.pt')")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
        subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, env=env, cwd=tmp_path)
        logits = torch.load(tmp_path / "logits.pt")
    else:
        model, info = AutoModelForMaskedLM.from_pretrained(str(tmp_path), output_loading_info=True)
        assert type(model) is NeoBERTLMHead
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
        loaded = model.state_dict()
        assert set(loaded) == set(sd)
        for k, v in sd.items():  # nothing re-initialised after loading (meta-device init in transformers 5)
            assert torch.equal(loaded[k], v), k
        logits = model.eval()(input_ids=ids, attention_mask=mask).logits
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[real], ref_logits[real], atol=ATOL, rtol=1e-5)


def test_save_and_from_pretrained_is_finite_and_identical(tmp_path, lm):
    lm.save_pretrained(str(tmp_path))
    again = NeoBERTLMHead.from_pretrained(str(tmp_path)).eval()
    ids = sentences([40])[0][None]
    a, b = lm(ids).logits, again(ids).logits
    assert torch.isfinite(b).all()
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------------
# Numerics
# ------------------------------------------------------------------------------------------------


def test_matches_reference_forward(lm, cfg, sd):
    ids, mask = pad(sentences([13, 7, 10]))
    out = lm(input_ids=ids, attention_mask=mask)
    ref_hidden, ref_logits = reference_forward(sd, cfg, ids, mask.bool())
    real = mask.bool()
    torch.testing.assert_close(out.logits[real], ref_logits[real], atol=ATOL, rtol=1e-5)
    # and without any mask, against the reference without one
    ids1 = sentences([21])[0][None]
    torch.testing.assert_close(lm(ids1).logits, reference_forward(sd, cfg, ids1)[1], atol=ATOL, rtol=1e-5)


def test_padding_invariance_right_and_left(cfg, sd):
    model = load_model(NeoBERT, cfg, sd)
    seqs = sentences([9, 4, 15])
    alone = [model(s[None]).last_hidden_state[0] for s in seqs]
    for left in (False, True):
        ids, mask = pad(seqs, left=left)
        batch = model(input_ids=ids, attention_mask=mask).last_hidden_state
        for i, s in enumerate(seqs):
            torch.testing.assert_close(batch[i][mask[i].bool()], alone[i], atol=ATOL, rtol=1e-5)
    # what sits in the padded slots does not matter
    ids, mask = pad(seqs)
    noisy = ids.masked_fill(mask == 0, 5)
    torch.testing.assert_close(model(noisy, attention_mask=mask).last_hidden_state[mask.bool()],
                               model(ids, attention_mask=mask).last_hidden_state[mask.bool()], atol=ATOL, rtol=1e-5)


def test_no_mask_equals_all_ones_mask(lm):
    ids = torch.stack(sentences([12, 12]))
    torch.testing.assert_close(lm(ids).logits, lm(ids, attention_mask=torch.ones_like(ids)).logits)


def test_eager_equals_sdpa(sd):
    ids, mask = pad(sentences([10, 3, 7]))
    sdpa = load_model(NeoBERTLMHead, tiny_config(attn_implementation="sdpa"), sd)
    eager = load_model(NeoBERTLMHead, tiny_config(attn_implementation="eager"), sd)
    assert eager.config._attn_implementation == "eager"
    a = sdpa(ids, attention_mask=mask).logits
    torch.testing.assert_close(eager(ids, attention_mask=mask).logits, a, atol=ATOL, rtol=1e-5)
    # output_attentions takes the eager path from an SDPA model: same result
    torch.testing.assert_close(sdpa(ids, attention_mask=mask, output_attentions=True).logits, a, atol=ATOL, rtol=1e-5)


def test_attention_is_bidirectional(cfg, sd):
    model = load_model(NeoBERT, cfg, sd)
    ids = sentences([10])[0][None]
    changed_last, changed_first = ids.clone(), ids.clone()
    changed_last[0, -1] = (ids[0, -1] % (VOCAB - 1)) + 1 if ids[0, -1] != VOCAB - 1 else 1
    changed_first[0, 0] = (ids[0, 0] % (VOCAB - 1)) + 1 if ids[0, 0] != VOCAB - 1 else 1
    base = model(ids).last_hidden_state
    assert not torch.allclose(model(changed_last).last_hidden_state[0, 0], base[0, 0], atol=1e-4)
    assert not torch.allclose(model(changed_first).last_hidden_state[0, -1], base[0, -1], atol=1e-4)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_equals_each_document_alone(sd, impl):
    model = load_model(NeoBERT, tiny_config(attn_implementation=impl), sd)
    docs = sentences([5, 9, 1, 7], seed=3)
    alone = torch.cat([model(d[None]).last_hidden_state[0] for d in docs])
    flat = torch.cat(docs + [torch.zeros(2, dtype=torch.long)])  # 2 pack-padding tokens after the last doc
    cu = torch.tensor([0, 5, 14, 15, 22], dtype=torch.int32)
    n = int(cu[-1])
    for layout in ((1, flat.numel()), (2, flat.numel() // 2), (flat.numel(),)):  # any batch layout
        out = model(flat.view(layout), cu_seqlens=cu, max_seqlen=9).last_hidden_state
        torch.testing.assert_close(out.reshape(-1, out.shape[-1])[:n], alone, atol=ATOL, rtol=1e-5)
        assert torch.isfinite(out).all()
    # the eager path also reports block-diagonal attention weights
    attn = model(flat[None], cu_seqlens=cu, output_attentions=True).attentions[0][0]  # [heads, T, T]
    assert attn[:, 5:14, :5].abs().max() == 0 and attn[:, :5, 5:].abs().max() == 0


def test_packed_rejects_padding_mask(lm):
    ids = torch.stack(sentences([6, 6]))
    mask = torch.ones_like(ids)
    mask[1, -1] = 0
    with pytest.raises(ValueError, match="cu_seqlens"):
        lm(ids, attention_mask=mask, cu_seqlens=torch.tensor([0, 6, 12]))


# ------------------------------------------------------------------------------------------------
# Outputs and heads
# ------------------------------------------------------------------------------------------------


def test_mlm_loss_equals_cross_entropy(lm):
    ids, mask = pad(sentences([8, 5]))
    labels = ids.clone()
    labels[:, ::2] = -100
    labels[mask == 0] = -100
    out = lm(ids, attention_mask=mask, labels=labels)
    keep = labels != -100
    manual = -out.logits.log_softmax(-1)[keep].gather(-1, labels[keep][:, None]).mean()
    torch.testing.assert_close(out.loss, manual)
    assert out.loss > 0
    loss, logits = lm(ids, attention_mask=mask, labels=labels, return_dict=False)[:2]
    torch.testing.assert_close(loss, out.loss)


def test_hidden_states_and_attentions(lm, cfg):
    ids, mask = pad(sentences([8, 5]))
    out = lm.model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == cfg.num_hidden_layers + 1
    assert all(h.shape == (2, 8, cfg.hidden_size) for h in out.hidden_states)
    torch.testing.assert_close(out.hidden_states[0], lm.model.encoder(ids))
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state)
    assert len(out.attentions) == cfg.num_hidden_layers
    for a in out.attentions:
        assert a.shape == (2, cfg.num_attention_heads, 8, 8)
        torch.testing.assert_close(a.sum(-1), torch.ones(2, cfg.num_attention_heads, 8))
        assert a[1, :, :, 5:].abs().max() < 1e-6  # padded keys get no weight
    assert lm.model(ids).hidden_states is None


def test_sequence_classification(sd):
    ids, mask = pad(sentences([8, 5, 6]))
    clf = load_model(NeoBERTForSequenceClassification, tiny_config(num_labels=3), sd).train()
    out = clf(ids, attention_mask=mask, labels=torch.tensor([0, 2, 1]))
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([0, 2, 1])))
    out.loss.backward()
    assert clf.model.transformer_encoder[0].qkv.weight.grad.abs().sum() > 0
    assert clf.classifier.weight.grad.abs().sum() > 0
    # the head reads the first token only
    other = ids.clone()
    other[0, 0] = 7 if ids[0, 0] != 7 else 8
    clf.eval()
    assert not torch.allclose(clf(other, attention_mask=mask).logits[0], clf(ids, attention_mask=mask).logits[0])

    reg = load_model(NeoBERTForSequenceClassification, tiny_config(num_labels=1), sd)
    target = torch.tensor([0.5, -1.0, 2.0])
    out = reg(ids, attention_mask=mask, labels=target)
    assert out.logits.shape == (3, 1)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits[:, 0], target))
    out.loss.backward()

    multi = load_model(NeoBERTForSequenceClassification, tiny_config(num_labels=4), sd)
    target = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1]], dtype=torch.float)
    out = multi(ids, attention_mask=mask, labels=target)
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, target))


def test_token_classification(sd):
    ids, mask = pad(sentences([8, 5]))
    tok = load_model(NeoBERTForTokenClassification, tiny_config(num_labels=5), sd).train()
    labels = torch.randint(0, 5, ids.shape)
    labels[0, 0] = -100
    out = tok(ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (2, 8, 5)
    keep = (labels != -100) & mask.bool()
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[keep], labels[keep]))
    out.loss.backward()
    assert tok.model.encoder.weight.grad.abs().sum() > 0


def test_classifier_heads_initialised_as_published():
    clf = NeoBERTForSequenceClassification(tiny_config(num_labels=2, hidden_size=256, num_attention_heads=4,
                                                       classifier_init_range=0.05))
    assert abs(clf.dense.weight.std().item() - 0.05) < 0.005 and clf.dense.bias.abs().max() == 0
    assert clf.model.encoder.weight.abs().max() <= 0.02  # encoder: uniform(-0.02, 0.02)


def test_gradient_checkpointing_gives_same_gradients(cfg, sd):
    ids, mask = pad(sentences([8, 5]))
    grads = []
    for ckpt in (False, True):
        model = load_model(NeoBERTLMHead, cfg, sd).train()
        if ckpt:  # newer releases renamed the switch; 5.2 only has the old name
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
            assert model.model.gradient_checkpointing
        model(ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append(model.model.transformer_encoder[0].qkv.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])


# ------------------------------------------------------------------------------------------------
# RoPE
# ------------------------------------------------------------------------------------------------


def rope_cos_sin(config, position_ids):
    rotary = NeoBERTRotaryEmbedding(config)
    return rotary(torch.zeros(1, dtype=torch.bfloat16), position_ids)


def test_rope_tables_match_complex_formula(cfg):
    pos = torch.arange(50)[None]
    cos, sin = rope_cos_sin(cfg, pos)
    assert cos.dtype == sin.dtype == torch.float32  # whatever the activations' dtype (bf16 here)
    freqs = 1.0 / (10000.0 ** (torch.arange(0, cfg.dim_head, 2).float() / cfg.dim_head))
    cis = torch.polar(torch.ones(50, cfg.dim_head // 2), torch.outer(torch.arange(50).float(), freqs))
    torch.testing.assert_close(cos[0, :, ::2], cis.real)  # interleaved pairs (2i, 2i+1) share an angle
    torch.testing.assert_close(sin[0, :, 1::2], cis.imag)


@pytest.mark.parametrize("kind", ["linear", "dynamic", "yarn"])
def test_rope_scaling_factor_one_is_identity(sd, kind):
    ids = sentences([30])[0][None]
    plain = load_model(NeoBERT, tiny_config(), sd)(ids).last_hidden_state
    scaled = load_model(NeoBERT, tiny_config(rope_parameters={"rope_type": kind, "factor": 1.0}), sd)
    torch.testing.assert_close(scaled(ids).last_hidden_state, plain, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("kind", ["linear", "dynamic", "yarn"])
def test_rope_scaling_changes_long_range_frequencies(sd, kind):
    ids = sentences([30])[0][None]
    plain = load_model(NeoBERT, tiny_config(), sd)(ids).last_hidden_state
    cfg = tiny_config(max_length=16, rope_parameters={"rope_type": kind, "factor": 4.0})
    assert not torch.allclose(load_model(NeoBERT, cfg, sd)(ids).last_hidden_state, plain, atol=1e-3)


def test_linear_scaling_at_f_times_p_equals_unscaled_at_p(sd):
    f = 4
    ids = sentences([12])[0][None]
    plain = load_model(NeoBERT, tiny_config(), sd)
    linear = load_model(NeoBERT, tiny_config(rope_parameters={"rope_type": "linear", "factor": float(f)}), sd)
    p = torch.arange(12)[None]
    torch.testing.assert_close(linear(ids, position_ids=f * p).last_hidden_state, plain(ids, position_ids=p).last_hidden_state)


def test_yarn_frequencies():
    base_cfg = tiny_config(hidden_size=64, num_attention_heads=4)
    inv = NeoBERTRotaryEmbedding(base_cfg).inv_freq
    yarn_cfg = tiny_config(hidden_size=64, num_attention_heads=4, max_length=4096,
                           rope_parameters={"rope_type": "yarn", "factor": 8.0})
    yarn_rope = NeoBERTRotaryEmbedding(yarn_cfg)
    yarn, scale = yarn_rope.inv_freq, yarn_rope.attention_scaling
    assert scale == pytest.approx(0.1 * torch.log(torch.tensor(8.0)).item() + 1)
    torch.testing.assert_close(yarn[0], inv[0])  # fast-rotating dims extrapolate
    torch.testing.assert_close(yarn[-1], inv[-1] / 8.0)  # slow ones interpolate
    assert ((yarn <= inv + 1e-12) & (yarn >= inv / 8.0 - 1e-12)).all()
    cos, sin = rope_cos_sin(yarn_cfg, torch.arange(5)[None])
    torch.testing.assert_close(cos.pow(2) + sin.pow(2), torch.full_like(cos, scale ** 2))
