"""Tests of megatron_neobert/conversion/state_dict_mapping.py (mcore <-> HF state dicts) and hf_format.py
(folder export and import)."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from megatron_neobert.hf import modeling_neobert as mn
from megatron_neobert.conversion.hf_format import (
    AUTO_MAP,
    MODEL_FILES,
    expected_hf_shapes,
    read_hf_folder,
    write_hf_folder,
)
from megatron_neobert.hf import NeoBERT, NeoBERTLMHead
from megatron_neobert.conversion.state_dict_mapping import (
    hf_state_dict_from_mcore,
    mcore_state_dict_from_hf,
    rotate_half_order,
)

from hf_fixtures import VOCAB, make_tokenizer, tiny_config  # tests/ is on sys.path (conftest.py)

PADDED = 256  # megatron pads the vocabulary to a multiple of 128 * TP
SENTENCES = ["the quick brown fox jumps over the lazy dog", "cats sleep", "a model reads long text with rotary positions"]


def random_hf_state_dict(config, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*shape, generator=g) * 0.2 + (1.0 if k.endswith("norm.weight") else 0.0)
            for k, shape in expected_hf_shapes(config).items()}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def cfg():
    return tiny_config()


@pytest.fixture(scope="module")
def hf_sd(cfg):
    return random_hf_state_dict(cfg)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, hf_sd, cfg, tokenizer_dir):
    dst = tmp_path_factory.mktemp("export") / "neobert"
    write_hf_folder(dst, hf_sd, cfg, tokenizer_path=tokenizer_dir)
    return dst


# ------------------------------------------------------------------------------------------------
# megatron-core <-> HF
# ------------------------------------------------------------------------------------------------


def test_hf_mcore_hf_round_trip_is_bit_exact(cfg, hf_sd):
    mcore = mcore_state_dict_from_hf(hf_sd, cfg, padded_vocab_size=PADDED)
    assert mcore["embedding.word_embeddings.weight"].shape == (PADDED, cfg.hidden_size)
    assert mcore["output_layer.weight"].shape == (PADDED, cfg.hidden_size) and mcore["output_layer.bias"].shape == (PADDED,)
    for name in ("embedding.word_embeddings.weight", "output_layer.weight", "output_layer.bias"):
        assert mcore[name][cfg.vocab_size:].abs().max() == 0  # padding rows are zeros
    assert "decoder.layers.1.input_layernorm.weight" in mcore and "decoder.layers.1.pre_mlp_layernorm.weight" in mcore
    assert len(mcore) == len(hf_sd)
    back = hf_state_dict_from_mcore(mcore, cfg, cfg.vocab_size)
    assert set(back) == set(hf_sd)
    for k, v in hf_sd.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k


def test_mcore_hf_mcore_round_trip_with_te_names_and_extra_state(cfg, hf_sd):
    mcore = mcore_state_dict_from_hf(hf_sd, cfg, padded_vocab_size=PADDED)
    te = {}
    for k, v in mcore.items():  # Transformer Engine spec: layer norms fused into the following linear
        k = k.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight")
        k = k.replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")
        te[k] = v
    te["decoder.layers.0.self_attention.core_attention._extra_state"] = torch.zeros(3)
    te["decoder.layers.0.mlp.linear_fc1._extra_state"] = None
    hf = hf_state_dict_from_mcore(te, cfg)
    again = mcore_state_dict_from_hf(hf, cfg, padded_vocab_size=PADDED)
    assert set(again) == set(mcore)
    for k, v in mcore.items():
        assert torch.equal(again[k], v), k


def test_mcore_to_hf_errors(cfg, hf_sd):
    mcore = mcore_state_dict_from_hf(hf_sd, cfg, padded_vocab_size=PADDED)
    both = dict(mcore, **{"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight": torch.ones(cfg.hidden_size)})
    with pytest.raises(ValueError, match="both"):
        hf_state_dict_from_mcore(both, cfg)
    with pytest.raises(ValueError, match="decoder.layers.2"):
        hf_state_dict_from_mcore(dict(mcore, **{"decoder.layers.2.mlp.linear_fc2.weight": torch.zeros(1)}), cfg)
    missing = {k: v for k, v in mcore.items() if k != "decoder.layers.1.mlp.linear_fc2.weight"}
    with pytest.raises(KeyError, match="decoder.layers.1.mlp.linear_fc2.weight"):
        hf_state_dict_from_mcore(missing, cfg)
    with pytest.raises(ValueError, match="fewer than vocab_size"):
        hf_state_dict_from_mcore(mcore, cfg, vocab_size=PADDED + 1)
    with pytest.raises(ValueError, match="smaller than vocab_size"):
        mcore_state_dict_from_hf(hf_sd, cfg, padded_vocab_size=cfg.vocab_size - 1)


def test_megatron_qkv_and_fc1_layouts_are_the_published_ones(cfg, hf_sd):
    """Megatron's split of linear_qkv / linear_fc1 (written out as in megatron-core's attention.py and mlp.py)
    applied to the converted weights gives the same q, k, v and FFN output as the published reading."""
    mcore = mcore_state_dict_from_hf(hf_sd, cfg)
    nh, hn, H, Fw = cfg.num_attention_heads, cfg.dim_head, cfg.hidden_size, cfg.ffn_hidden_size
    x = torch.randn(5, 2, H)  # megatron's [seq, batch, hidden]
    mixed = x @ mcore["decoder.layers.0.self_attention.linear_qkv.weight"].T
    mixed = mixed.view(5, 2, nh, (1 + 2) * hn)  # num_query_groups == num_heads: one q head per group
    q_m, k_m, v_m = torch.split(mixed, [hn, hn, hn], dim=3)
    w = hf_sd["model.transformer_encoder.0.qkv.weight"].view(nh, 3, hn, H)  # published: per head [q; k; v]
    order = rotate_half_order(hn)  # megatron-core's q and k dimensions are the published ones in rotate-half order
    for j, (m, dims) in enumerate(((q_m, order), (k_m, order), (v_m, torch.arange(hn)))):
        torch.testing.assert_close(m, (x @ w[:, j].reshape(nh * hn, H).T).view(5, 2, nh, hn)[..., dims])

    fc1 = mcore["decoder.layers.0.mlp.linear_fc1.weight"]
    x_glu, x_linear = torch.chunk(x @ fc1.T, 2, dim=-1)
    megatron = (F.silu(x_glu) * x_linear) @ mcore["decoder.layers.0.mlp.linear_fc2.weight"].T
    ffn = mn.NeoBERTSwiGLU(H, Fw)
    ffn.load_state_dict({"w12.weight": hf_sd["model.transformer_encoder.0.ffn.w12.weight"],
                         "w3.weight": hf_sd["model.transformer_encoder.0.ffn.w3.weight"]})
    torch.testing.assert_close(ffn(x), megatron)


def test_shape_bridge_round_trip():
    """NeoBERTArch -> HF config -> NeoBERTArch is the identity, the real SwiGLU width carried as it is."""
    from megatron_neobert.conversion.shape_bridge import arch_for_hf_config, hf_config_for_arch
    from megatron_neobert.model import PRESETS, get_arch

    c = hf_config_for_arch(PRESETS["neobert-250m"])
    assert c.intermediate_size == 3072 and c.ffn_hidden_size == 2048 and c.dim_head == 64
    assert (c.num_hidden_layers, c.hidden_size, c.vocab_size, c.max_length) == (28, 768, 30522, 4096)
    for width in (8, 48, 64, 100, 1408, 2816, 5464):  # any width, not only the published rule's
        arch = get_arch("neobert-tiny", ffn_hidden_size=width, rotary_base=500, init_range=0.01)
        assert arch_for_hf_config(hf_config_for_arch(arch)) == arch


# ------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------


def test_exported_folder_contents(exported, cfg, hf_sd, tokenizer_dir):
    names = {p.relative_to(exported).as_posix() for p in exported.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "modeling_neobert.py", "configuration_neobert.py", "tokenizer.json",
            "tokenizer_config.json",
            "modules.json", "sentence_bert_config.json", "1_Pooling/config.json",
            "config_sentence_transformers.json"} <= names
    config = json.loads((exported / "config.json").read_text())
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "dim_head",
                  "vocab_size", "pad_token_id", "norm_eps", "max_length", "embedding_init_range",
                  "decoder_init_range", "classifier_init_range", "ffn_hidden_size", "rope_parameters"):
        assert config[field] == getattr(cfg, field), field
    assert config["model_type"] == "neobert" and config["architectures"] == ["NeoBERTLMHead"]
    assert config["torch_dtype"] == "float32" and config["auto_map"] == AUTO_MAP
    assert set(AUTO_MAP) == {"AutoConfig", "AutoModel", "AutoModelForMaskedLM",
                             "AutoModelForSequenceClassification", "AutoModelForTokenClassification",
                             "AutoModelForQuestionAnswering", "AutoModelForMultipleChoice"}
    weights = load_file(str(exported / "model.safetensors"))
    assert set(weights) == set(hf_sd)
    assert all(torch.equal(weights[k], v) for k, v in hf_sd.items())
    for source in MODEL_FILES:  # the generated files, for users who load with remote code
        assert (exported / source.name).read_bytes() == source.read_bytes()
    pooling = json.loads((exported / "1_Pooling/config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    assert pooling["word_embedding_dimension"] == cfg.hidden_size


def test_refuses_to_overwrite_unless_asked(tmp_path, cfg, hf_sd):
    dst = tmp_path / "out"
    write_hf_folder(dst, hf_sd, cfg)
    with pytest.raises(FileExistsError, match=str(dst)):
        write_hf_folder(dst, hf_sd, cfg)
    other = random_hf_state_dict(cfg, seed=1)
    write_hf_folder(dst, other, cfg, overwrite=True)
    sd, _ = read_hf_folder(dst)
    assert torch.equal(sd["decoder.bias"], other["decoder.bias"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or old folders left


def test_failure_midway_leaves_nothing_half_written(tmp_path, cfg, hf_sd):
    not_a_tokenizer = tmp_path / "empty"
    not_a_tokenizer.mkdir()
    dst = tmp_path / "out"
    # the tokenizer is copied after config and weights were written: the error comes midway
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        write_hf_folder(dst, hf_sd, cfg, tokenizer_path=not_a_tokenizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]
    # an existing export survives a failed overwrite untouched
    write_hf_folder(dst, hf_sd, cfg)
    before = (dst / "model.safetensors").read_bytes()
    with pytest.raises(FileNotFoundError):
        write_hf_folder(dst, random_hf_state_dict(cfg, seed=2), cfg, tokenizer_path=not_a_tokenizer, overwrite=True)
    assert (dst / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]


def test_write_rejects_wrong_state_dict(tmp_path, cfg, hf_sd):
    bad = dict(hf_sd)
    del bad["model.transformer_encoder.1.wo.weight"]
    with pytest.raises(ValueError, match="model.transformer_encoder.1.wo.weight"):
        write_hf_folder(tmp_path / "x", bad, cfg)
    assert not (tmp_path / "x").exists()


def test_bf16_export(tmp_path, cfg, hf_sd):
    from transformers import AutoModelForMaskedLM

    dst = write_hf_folder(tmp_path / "bf16", hf_sd, cfg, dtype=torch.bfloat16)
    assert json.loads((dst / "config.json").read_text())["torch_dtype"] == "bfloat16"
    sd, _ = read_hf_folder(dst)
    for k, v in hf_sd.items():
        assert sd[k].dtype == torch.bfloat16 and torch.equal(sd[k], v.to(torch.bfloat16)), k
    import transformers

    # the loading argument was renamed in transformers 5 (torch_dtype -> dtype)
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForMaskedLM.from_pretrained(str(dst), **{dtype_kw: torch.bfloat16})
    assert model.decoder.weight.dtype == torch.bfloat16
    logits = model(torch.tensor([[2, 10, 11, 3]])).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_rope_parameters_survive_export(tmp_path, hf_sd):
    from transformers import AutoConfig

    cfg = tiny_config(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    dst = write_hf_folder(tmp_path / "yarn", hf_sd, cfg)
    assert read_hf_folder(dst)[1].rope_parameters == cfg.rope_parameters
    assert AutoConfig.from_pretrained(str(dst)).rope_parameters == cfg.rope_parameters


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------


def test_read_round_trip(exported, cfg, hf_sd):
    sd, config = read_hf_folder(exported)
    assert all(torch.equal(sd[k], v) for k, v in hf_sd.items()) and set(sd) == set(hf_sd)
    assert config.to_dict()["hidden_size"] == cfg.hidden_size and config.ffn_hidden_size == cfg.ffn_hidden_size
    assert config.vocab_size == cfg.vocab_size and config.rope_parameters == cfg.rope_parameters


def test_read_sharded_and_bin(tmp_path, cfg, hf_sd):
    keys = sorted(hf_sd)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text(json.dumps(mn.NeoBERTConfig.to_dict(cfg)))
    for name, ks in shards.items():
        save_file({k: hf_sd[k] for k in ks}, str(sharded / name))
    index = {"metadata": {}, "weight_map": {k: name for name, ks in shards.items() for k in ks}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    sd, _ = read_hf_folder(sharded)
    assert all(torch.equal(sd[k], v) for k, v in hf_sd.items())

    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        read_hf_folder(sharded)

    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text(json.dumps(cfg.to_dict()))
    torch.save(hf_sd, binary / "pytorch_model.bin")
    sd, _ = read_hf_folder(binary)
    assert all(torch.equal(sd[k], v) for k, v in hf_sd.items())


def test_read_headless_checkpoint(tmp_path, cfg, hf_sd):
    base = NeoBERT(cfg)
    base.load_state_dict({k[len("model."):]: v for k, v in hf_sd.items() if k.startswith("model.")})
    base.save_pretrained(str(tmp_path))
    sd, _ = read_hf_folder(tmp_path)
    assert set(sd) == set(expected_hf_shapes(cfg, with_head=False))
    assert torch.equal(sd["model.encoder.weight"], hf_sd["model.encoder.weight"])
    with pytest.raises(KeyError, match="MLM head"):
        mcore_state_dict_from_hf(sd, cfg)


def test_read_errors(tmp_path, exported, cfg, hf_sd):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        read_hf_folder(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a Hugging Face checkpoint"):
        read_hf_folder(tmp_path / "empty")

    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"],
                                                  "hidden_size": 768, "vocab_size": 30522}))
    with pytest.raises(ValueError, match="model_type='bert'.*not a NeoBERT checkpoint"):
        read_hf_folder(bert)

    mismatch = tmp_path / "mismatch"
    write_hf_folder(mismatch, hf_sd, cfg)
    config = json.loads((mismatch / "config.json").read_text())
    config["vocab_size"] = cfg.vocab_size + 28
    (mismatch / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"vocab size mismatch: config has vocab_size={cfg.vocab_size + 28}"):
        read_hf_folder(mismatch)

    broken = tmp_path / "broken"
    write_hf_folder(broken, hf_sd, cfg)
    weights = load_file(str(broken / "model.safetensors"))
    del weights["model.transformer_encoder.0.ffn.w3.weight"]
    weights["pooler.dense.weight"] = torch.zeros(2, 2)
    save_file(weights, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing keys \[model.transformer_encoder.0.ffn.w3.weight\].*"
                                         r"unexpected keys \[pooler.dense.weight\]"):
        read_hf_folder(broken)

    (broken / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no weights"):
        read_hf_folder(broken)


# ------------------------------------------------------------------------------------------------
# Loading the export with transformers and sentence-transformers (offline, trust_remote_code)
# ------------------------------------------------------------------------------------------------


def test_auto_classes_load_export(exported, cfg, hf_sd):
    from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForMultipleChoice,
                              AutoModelForQuestionAnswering, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification, AutoTokenizer)

    reference = NeoBERTLMHead(cfg).eval()
    reference.load_state_dict(hf_sd)
    tok = AutoTokenizer.from_pretrained(str(exported))
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    assert batch["input_ids"][0, 0] == VOCAB.index("[CLS]") and tok.pad_token_id == cfg.pad_token_id
    expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

    config = AutoConfig.from_pretrained(str(exported))
    assert type(config).__name__ == "NeoBERTConfig" and config.ffn_hidden_size == cfg.ffn_hidden_size

    mlm, info = AutoModelForMaskedLM.from_pretrained(str(exported), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(mlm.eval()(**batch).logits, expected.logits)

    base, info = AutoModel.from_pretrained(str(exported), output_loading_info=True)
    assert type(base).__name__ == "NeoBERT" and not info["missing_keys"]
    hidden = base.eval()(**batch).last_hidden_state
    torch.testing.assert_close(hidden, reference.model(batch["input_ids"], batch["attention_mask"]).last_hidden_state)

    clf, info = AutoModelForSequenceClassification.from_pretrained(
        str(exported), num_labels=3, output_loading_info=True)
    assert set(info["missing_keys"]) == {"dense.weight", "dense.bias", "classifier.weight", "classifier.bias"}
    assert torch.equal(clf.model.encoder.weight, hf_sd["model.encoder.weight"])
    out = clf(**batch, labels=torch.tensor([0, 1, 2]))
    assert out.logits.shape == (3, 3) and torch.isfinite(out.loss)
    out.loss.backward()

    tagger = AutoModelForTokenClassification.from_pretrained(str(exported), num_labels=4)
    assert tagger(**batch).logits.shape == batch["input_ids"].shape + (4,)

    qa = AutoModelForQuestionAnswering.from_pretrained(str(exported))
    assert qa(**batch).start_logits.shape == batch["input_ids"].shape
    choices = AutoModelForMultipleChoice.from_pretrained(str(exported))
    assert choices(**{k: v[None] for k, v in batch.items()}).logits.shape == (1, 3)


def test_sentence_transformers_mean_pooling(exported, cfg, hf_sd):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    st = SentenceTransformer(str(exported), device="cpu")
    together = st.encode(SENTENCES, batch_size=8, convert_to_tensor=True)
    alone = torch.stack([st.encode([s], convert_to_tensor=True)[0] for s in SENTENCES])
    assert together.shape == (3, cfg.hidden_size)
    torch.testing.assert_close(together, alone, atol=2e-5, rtol=1e-5)

    # mean of the final hidden states over real tokens, computed here from the weights
    encoder = NeoBERT(cfg).eval()
    encoder.load_state_dict({k[len("model."):]: v for k, v in hf_sd.items() if k.startswith("model.")})
    tok = AutoTokenizer.from_pretrained(str(exported))
    for sentence, emb in zip(SENTENCES, alone):
        ids = tok(sentence, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            expected = encoder(ids).last_hidden_state[0].mean(0)
        torch.testing.assert_close(emb, expected, atol=2e-5, rtol=1e-5)


def test_exported_tokenizer_loads_with_the_standard_class_alone(exported, monkeypatch, caplog):
    """No remote code, no prompt, no warning; the same ids as AutoTokenizer with the model's config; no
    token_type_ids (NeoBERT has no token types)."""
    import builtins

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    monkeypatch.setattr(builtins, "input", lambda *a: pytest.fail(f"prompted: {a}"))
    with caplog.at_level("WARNING"):
        tok = PreTrainedTokenizerFast.from_pretrained(str(exported))
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    batch = tok(SENTENCES, padding=True)
    assert set(batch) == {"input_ids", "attention_mask"}
    assert batch["input_ids"] == AutoTokenizer.from_pretrained(str(exported))(
        SENTENCES, padding=True)["input_ids"]


def test_an_exported_tokenizer_loads_without_running_model_code(exported):
    """The trainer and the converter read an export's tokenizer (or the released model's) with no prompt to run
    NeoBERT's code and no warning of a generic config; stdin closed, as under a scheduler."""
    import subprocess
    import sys

    code = ("import sys; from megatron_neobert.data.tokenizer import build_tokenizer; "
            "t = build_tokenizer('HuggingFaceTokenizer', sys.argv[1]); print('ids', t.tokenize('the cat sat'))")
    done = subprocess.run([sys.executable, "-c", code, str(exported)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert "custom code" not in output and "model of type" not in output, output
    assert "ids [" in done.stdout
