"""Checkpoint conversion: HF (published layout) <-> megatron-core distributed checkpoints at TP x PP,
and to and from the trainer's checkpoints.

Megatron runs on gloo CPU ranks; the HF side is our remote-code model loaded through the Auto
classes, offline. The test model is the trainer tests' cut of the tiny preset with 4 layers of 64
and the built-in 8192-entry tokenizer, so that the trainer can load the converted checkpoint; its
vocabulary of 8200 pads to other sizes at other TP and padding multiples (as 30522 does). The 250M
key/shape check runs on the meta device.
"""

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from megatron.core import dist_checkpointing
from safetensors.torch import load_file, save_file

from checkpoint_files import rewrite_common_state
from convert_cases import load_and_forward
from megatron_neobert.conversion.shape_bridge import hf_config_for_arch
from megatron_neobert.conversion.convert import (ConversionError, build_single_rank_model,
                                                 hf_to_mcore, mcore_to_hf)
from megatron_neobert.conversion.hf_format import AUTO_MAP, TOKENIZER_FILES, hf_config_dict, read_hf_folder
from megatron_neobert.conversion.state_dict_mapping import hf_state_dict_from_mcore, mcore_state_dict_from_hf
from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.megatron_core_compat import load_common_state
from megatron_neobert.model import get_arch
from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.checkpoint.layout import iteration_dir, read_latest_iteration
from megatron_neobert.checkpoint.state import checkpoint_args
from parallel_cases import Layout
from pretrain_cases import run_train, tiny_argv
from shared_runs import run_once
from test_hf_format import random_hf_state_dict
from tools.convert_checkpoint import main as cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = ["the quick brown fox jumps over the lazy dog", "cats sleep",
             "a model reads long text with rotary positions", "red birds sing"]
TP2PP2 = Layout(tp=2, pp=2)
VOCAB_SIZE = 8200  # the built-in tokenizer's 8192 and 8 unused rows
# hf-to-mcore at TP=2 with a padding multiple of 32 pads to 8256 rows; the trainer would pad to 8320 at TP=1
PADDED_VOCAB, VOCAB_MULTIPLE = 8256, 32
# on top of tiny_argv's 64 wide, 4 heads, FFN 128
TRAINER_ARCH_FLAGS = ["--num-layers", "4", "--vocab-size", str(VOCAB_SIZE)]


def official_folder(path, config, state_dict, tokenizer=None):
    """A folder as published on the hub: config.json with the official fields, official key names."""
    path.mkdir(parents=True)
    fields = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "dim_head",
              "vocab_size", "pad_token_id", "norm_eps", "max_length", "embedding_init_range",
              "decoder_init_range", "classifier_init_range")
    cfg = {f: getattr(config, f) for f in fields}
    cfg.update(model_type="neobert", architectures=["NeoBERTLMHead"], auto_map=AUTO_MAP, torch_dtype="float32",
               rope=True, kwargs={"classifier_dropout": 0.1})  # published quirks
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(state_dict, str(path / "model.safetensors"), metadata={"format": "pt"})
    for name in (os.listdir(tokenizer) if tokenizer else []):
        shutil.copy(os.path.join(tokenizer, name), path / name)
    return path


def tiny_config():
    from megatron_neobert.hf import NeoBERTConfig

    # intermediate 192 -> SwiGLU width 128, the trainer's --ffn-hidden-size in tiny_argv
    return NeoBERTConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=192,
                         vocab_size=VOCAB_SIZE, max_length=1024)


def padded_batch(tokenizer_path=SAMPLE_TOKENIZER, micro_batch_size=2):
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(str(tokenizer_path))(SENTENCES, padding=True, return_tensors="pt")
    assert not enc["attention_mask"].all()  # the batch really has padding
    tokens, mask = enc["input_ids"], enc["attention_mask"].bool()
    micro = [dict(tokens=tokens[i:i + micro_batch_size], attention_mask=mask[i:i + micro_batch_size])
             for i in range(0, len(SENTENCES), micro_batch_size)]
    return enc, micro


def hf_mlm_logits(folder, enc):
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(folder), trust_remote_code=True).eval()
    with torch.no_grad():
        return model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits


def last_stage(results):
    logits = [r for r in results if r is not None]
    assert len(logits) == 2  # TP=2 ranks of the last stage, both with the full (gathered) logits
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)
    return logits[0]


def leftovers(parent, keep):
    return sorted(p.name for p in parent.iterdir() if p.name not in keep)


# ------------------------------------------------------------------------------------------------
# HF (official layout) -> Megatron TP=2 x PP=2 -> HF
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def config():
    return tiny_config()


@pytest.fixture(scope="module")
def hf_weights(config):
    return random_hf_state_dict(config, seed=3)


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory, config, hf_weights):
    """(folder, hf-to-mcore summary, mcore-to-hf summary), converted once per session; the tests only read the
    folder (or copy from it)."""
    def convert(tmp):
        src = official_folder(tmp / "official", config, hf_weights, SAMPLE_TOKENIZER)
        summary = hf_to_mcore(src, tmp / "mcore", tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                              make_vocab_size_divisible_by=VOCAB_MULTIPLE)
        export = mcore_to_hf(tmp / "mcore", tmp / "hf")
        return tmp, summary, export
    return run_once(tmp_path_factory, "test_convert-round_trip", convert)


@pytest.mark.integration
def test_hf_to_mcore_writes_the_trainer_layout_from_tp2_pp2(round_trip, config):
    tmp, summary, _ = round_trip
    root = tmp / "mcore"
    assert read_latest_iteration(str(root)) == 0
    assert sorted(os.listdir(root)) == ["iter_0000000", "latest_checkpointed_iteration.txt"]
    ckpt = iteration_dir(str(root), 0)
    # torch_dist writes one __<rank>_<n>.distcp set per saving rank: 4 ranks wrote it
    assert {name.split("_")[2] for name in os.listdir(ckpt) if name.endswith(".distcp")} == {"0", "1", "2", "3"}
    common = load_common_state(ckpt)
    assert isinstance(common["args"], argparse.Namespace)  # as Megatron-LM saves it, sizes at top level
    args = checkpoint_args(common)
    assert common["iteration"] == 0 and common["checkpoint_version"] == 3.0
    assert (args["num_layers"], args["hidden_size"], args["ffn_hidden_size"]) == (4, 64, 128)
    assert args["arch"] == dict(num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                                vocab_size=VOCAB_SIZE, max_sequence_length=1024, normalization="RMSNorm",
                                activation="swiglu", position_embedding_type="rope", add_bias_linear=False,
                                norm_epsilon=1e-5, rotary_base=10000, init_range=0.02)
    assert args["padded_vocab_size"] == PADDED_VOCAB  # a multiple of 32 x TP=2
    assert (args["tensor_model_parallel_size"], args["pipeline_model_parallel_size"]) == (2, 2)
    assert args["tokenizer_type"] == "HuggingFaceTokenizer"
    assert args["tokenizer_model"] == str((tmp / "official").resolve())
    assert args["model_preset"] is None  # tiny test dims are no preset
    meta = dist_checkpointing.load_tensors_metadata(ckpt)
    assert tuple(meta["embedding.word_embeddings.weight"].global_shape) == (PADDED_VOCAB, 64)
    assert not any(k.startswith("optimizer") for k in meta)
    assert summary.tensors == 28 and summary.parameters == sum(v.numel() for v in random_hf_state_dict(config).values())


def test_hf_to_mcore_at_tp1_saves_the_trainer_layout_from_this_process_and_round_trips_bit_exact(
        round_trip, hf_weights, tmp_path, monkeypatch):
    """At TP=1/PP=1 the model the weights go into is the target layout: saved here with the trainer's common state,
    no rank started (each imports megatron-core again), nothing staged left; it exports back bit for bit."""
    import megatron_neobert.parallel.launch as launch

    def no_rank(*args, **kwargs):
        raise AssertionError("hf_to_mcore started ranks for a TP=1/PP=1 target")
    monkeypatch.setattr(launch, "run_on_ranks", no_rank)
    root = tmp_path / "mcore"
    hf_to_mcore(round_trip[0] / "official", root, progress=False)
    assert sorted(os.listdir(root)) == ["iter_0000000", "latest_checkpointed_iteration.txt"]
    args = checkpoint_args(load_common_state(iteration_dir(str(root), 0)))
    assert (args["tensor_model_parallel_size"], args["pipeline_model_parallel_size"], args["world_size"]) == (1, 1, 1)
    meta = dist_checkpointing.load_tensors_metadata(iteration_dir(str(root), 0))
    assert tuple(meta["embedding.word_embeddings.weight"].global_shape) == (args["padded_vocab_size"], 64)
    mcore_to_hf(root, tmp_path / "hf", progress=False)
    back = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(back) == set(hf_weights)
    for key, value in hf_weights.items():
        assert torch.equal(back[key], value), key


@pytest.mark.integration
def test_round_trip_is_bit_exact(round_trip, config, hf_weights):
    tmp, _, export = round_trip
    back = load_file(str(tmp / "hf" / "model.safetensors"))
    assert set(back) == set(hf_weights)
    for k, v in hf_weights.items():
        assert back[k].dtype == torch.float32 and torch.equal(back[k], v), k
    written = json.loads((tmp / "hf" / "config.json").read_text())
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "dim_head",
                  "vocab_size", "norm_eps", "max_length"):
        assert written[field] == getattr(config, field), field
    assert written["auto_map"] == AUTO_MAP and written["architectures"] == ["NeoBERTLMHead"]
    assert export.tensors == 28 and export.dtype == "fp32"
    assert export.bytes_on_disk == sum(p.stat().st_size for p in (tmp / "hf").rglob("*") if p.is_file())
    # the tokenizer named in the checkpoint args came along
    assert (tmp / "hf" / "tokenizer.json").read_bytes() == (tmp / "official" / "tokenizer.json").read_bytes()
    assert leftovers(tmp, {"official", "mcore", "hf"}) == []


@pytest.mark.integration
def test_megatron_tp2_pp2_logits_equal_hf_logits(round_trip):
    tmp, _, _ = round_trip
    enc, micro = padded_batch()
    megatron = last_stage(run_on_ranks(load_and_forward, 4, str(tmp / "mcore"), TP2PP2, micro))
    hf = hf_mlm_logits(tmp / "hf", enc)
    assert megatron.shape == hf.shape[:2] + (PADDED_VOCAB,)
    megatron = megatron[..., :VOCAB_SIZE]
    assert hf.abs().max() > 1.0  # random weights of scale 0.2: logits far from uniform
    # Real tokens only: what a padded query position computes is each implementation's own business.
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(megatron[real], hf[real], rtol=1e-4, atol=1e-4)


def test_qk_rows_are_stored_rotate_half_per_head_and_permuted_back_bit_exact(config, hf_weights):
    mcore = mcore_state_dict_from_hf(hf_weights, config, PADDED_VOCAB)
    heads, d = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    for i in range(config.num_hidden_layers):
        hf = hf_weights[f"model.transformer_encoder.{i}.qkv.weight"].view(heads, 3, d, -1)
        ours = mcore[f"decoder.layers.{i}.self_attention.linear_qkv.weight"].view(heads, 3, d, -1)
        for part in (0, 1):  # q and k: HF's pair (2j, 2j+1) is our (j, j + d/2)
            assert torch.equal(ours[:, part, :d // 2], hf[:, part, 0::2])
            assert torch.equal(ours[:, part, d // 2:], hf[:, part, 1::2])
        assert torch.equal(ours[:, 2], hf[:, 2])  # v as it is
    back = hf_state_dict_from_mcore(mcore, config)
    assert set(back) == set(hf_weights) and all(torch.equal(back[k], v) for k, v in hf_weights.items())


def packed_batch(enc):
    """The sentences' real tokens end to end in one packed micro-batch, as the loader packs them."""
    docs = [ids[mask.bool()] for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
    lengths = torch.tensor([0] + [len(d) for d in docs])
    return [dict(tokens=torch.cat(docs)[None], cu_seqlens=torch.cumsum(lengths, 0).to(torch.int32))]


@pytest.mark.integration
@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_logits_equal_hf_logits_packed_and_padded(round_trip, tp):
    """The converted checkpoint loaded at TP 1 and TP 2 (megatron-core reshards), packed and padded
    micro-batches, against the published (interleaved RoPE) layout run by the HF model."""
    tmp, _, _ = round_trip
    enc, padded = padded_batch()
    packed = packed_batch(enc)
    hf = hf_mlm_logits(tmp / "hf", enc)
    real = enc["attention_mask"].bool()
    for micro in (padded, packed):
        results = run_on_ranks(load_and_forward, tp, str(tmp / "mcore"), Layout(tp=tp), micro)
        for other in results[1:]:
            torch.testing.assert_close(other, results[0], rtol=0, atol=0)
        megatron = results[0][..., :VOCAB_SIZE]
        megatron = megatron[real] if micro is padded else megatron[0]  # packed: the real tokens in order
        torch.testing.assert_close(megatron, hf[real], rtol=1e-4, atol=1e-4)


@pytest.mark.integration
def test_exported_folder_loads_with_auto_classes_and_sentence_transformers(round_trip, hf_weights):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

    folder = str(round_trip[0] / "hf")
    base = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert type(base).__name__ == "NeoBERT" and torch.equal(base.encoder.weight, hf_weights["model.encoder.weight"])
    mlm = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True)
    assert torch.equal(mlm.decoder.bias, hf_weights["decoder.bias"])
    clf = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True, num_labels=2)
    assert torch.equal(clf.model.transformer_encoder[3].wo.weight,
                       hf_weights["model.transformer_encoder.3.wo.weight"])

    st = SentenceTransformer(folder, trust_remote_code=True, device="cpu")
    together = st.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_tensor=True)
    alone = torch.stack([st.encode([s], convert_to_tensor=True)[0] for s in SENTENCES])
    assert together.shape == (len(SENTENCES), 64) and together.std() > 0
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=2e-5)


# ------------------------------------------------------------------------------------------------
# The trainer's checkpoints
# ------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_trainer_checkpoint_exports_equal_logits(data, tmp_path):
    """Three trainer steps at TP=2 x PP=2 x VPP=2 (optimizer, scheduler and RNG state saved too) ->
    HF: the same MLM logits as megatron-core running the trainer's checkpoint at that layout."""
    save = tmp_path / "run"
    run_on_ranks(run_train, 4, tiny_argv(
        *data, *TRAINER_ARCH_FLAGS, "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--num-layers-per-virtual-pipeline-stage", "1", "--train-iters", "3", "--lr-warmup-iters", "1", "--save", str(save),
        "--save-interval", "3"))
    assert any(k.startswith("optimizer") for k in dist_checkpointing.load_tensors_metadata(iteration_dir(str(save), 3)))

    export = mcore_to_hf(save, tmp_path / "hf")
    assert export.tensors == 4 * 6 + 4
    # the tokenizer named in the trainer's args (the built-in one) came along
    assert (tmp_path / "hf" / "vocab.txt").read_bytes() == open(os.path.join(SAMPLE_TOKENIZER, "vocab.txt"), "rb").read()
    enc, micro = padded_batch(tmp_path / "hf")
    megatron = last_stage(run_on_ranks(load_and_forward, 4, str(save), Layout(tp=2, pp=2, vpp=2), micro))
    megatron = megatron[..., :VOCAB_SIZE]  # padded to 8448 at TP=2
    hf = hf_mlm_logits(tmp_path / "hf", enc)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(megatron[real], hf[real], rtol=1e-4, atol=1e-5)


@pytest.mark.integration
def test_trainer_continues_from_converted_checkpoint(round_trip, data, hf_weights, tmp_path, capfd):
    """HF -> TP=2 x PP=2 checkpoint -> the trainer loads it at another layout (PP=2, with the checkpoint's
    8256 vocabulary rows, not the 8320 of TP=1) and takes a step at learning rate 0 -> its checkpoint
    exports the original weights bit for bit. No --finetune: the trainer sees that the checkpoint holds no
    optimizer, schedule or data position and starts at iteration 0, as --finetune would (the same code
    path; --finetune itself is tested in test_pretrain's stage 2)."""
    save = tmp_path / "continued"
    history = run_on_ranks(run_train, 2, tiny_argv(
        *data, *TRAINER_ARCH_FLAGS, "--pipeline-model-parallel-size", "2", "--load", str(round_trip[0] / "mcore"),
        "--lr", "0", "--min-lr", "0", "--train-iters", "1", "--lr-warmup-iters", "0",
        "--lr-decay-iters", "1", "--save", str(save),
        "--save-interval", "1"))[0]
    assert [r["iteration"] for r in history["train"]] == [1]
    assert torch.isfinite(torch.tensor(history["train"][0]["loss"]))
    printed = capfd.readouterr().out
    assert printed.count("holds model weights only: starting from iteration 0 as with --finetune") == 1, printed
    # (a fresh initialisation instead of the converted weights would fail the comparison below)
    mcore_to_hf(save, tmp_path / "hf")
    back = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(back) == set(hf_weights)
    for k, v in hf_weights.items():
        assert torch.equal(back[k], v), k


# ------------------------------------------------------------------------------------------------
# The 250M preset: the official 172 keys and shapes
# ------------------------------------------------------------------------------------------------


def official_250m_shapes():
    """The published checkpoint's shapes, written out independently of hf_format.expected_hf_shapes."""
    shapes = {"model.encoder.weight": (30522, 768), "model.layer_norm.weight": (768,),
              "decoder.weight": (30522, 768), "decoder.bias": (30522,)}
    for i in range(28):
        p = f"model.transformer_encoder.{i}."
        shapes.update({p + "attention_norm.weight": (768,), p + "qkv.weight": (2304, 768),
                       p + "wo.weight": (768, 768), p + "ffn_norm.weight": (768,),
                       p + "ffn.w12.weight": (4096, 768), p + "ffn.w3.weight": (768, 2048)})
    return shapes


def test_250m_preset_converts_to_the_official_keys_and_shapes(single_rank):
    arch = get_arch("neobert-250m")
    with torch.device("meta"):  # the real megatron-core model and mapping, without 1 GB of weights
        model = build_single_rank_model(arch, vocab_size=30592)  # 30522 padded to a multiple of 128
    hf = hf_state_dict_from_mcore(model.state_dict(), hf_config_for_arch(arch))
    assert len(hf) == 172
    assert {k: tuple(v.shape) for k, v in hf.items()} == official_250m_shapes()
    assert sum(v.numel() for v in hf.values()) == 245_136_954
    assert sum(v.numel() for k, v in hf.items() if not k.startswith("decoder.")) == 221_665_536
    cfg = hf_config_dict(hf_config_for_arch(arch))
    assert (cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["dim_head"]) == (3072, 28, 768, 64)
    assert (cfg["vocab_size"], cfg["max_length"], cfg["norm_eps"], cfg["model_type"]) == (30522, 4096, 1e-5, "neobert")


# ------------------------------------------------------------------------------------------------
# Bad input: a clear error, nothing written
# ------------------------------------------------------------------------------------------------


def tampered_checkpoint(round_trip, tmp_path, **arg_changes):
    """A copy of the round-trip checkpoint whose common args are changed."""
    dst = tmp_path / "tampered"
    shutil.copytree(round_trip[0] / "mcore", dst)

    def change(common):
        args = checkpoint_args(common)
        for key, value in arg_changes.items():
            if key in args["arch"]:
                args["arch"][key] = value
            else:
                args[key] = value

    rewrite_common_state(dst / "iter_0000000", change)
    return dst


@pytest.mark.integration
@pytest.mark.parametrize("case, message", [
    ("empty folder", "not a megatron-core distributed checkpoint"),
    ("hf folder", "not a megatron-core distributed checkpoint"),
    ("missing shard", r"shard file __1_0.distcp holding model tensors is missing"),
    ("other architecture", r"does not hold the model its args describe.*wrong shapes "
                           r"\['decoder.final_layernorm.weight|wrong shapes \['decoder.layers.mlp"),
    ("other vocabulary", r"wrong shapes \['embedding.word_embeddings.weight: \(8256, 64\) in the checkpoint, "
                         r"\(8448, 64\)"),
    ("vocab beyond padding", "padded_vocab_size=8256, smaller than the vocabulary"),
    ("bert-like m0", "only NeoBERT's RoPE / SwiGLU / RMSNorm"),
    ("preset mismatch", r"does not match --model-preset neobert-tiny: hidden_size=64 \(preset: 128\), "
                        r"ffn_hidden_size=128 \(preset: 344\), vocab_size=8200 \(preset: 8192\)$"),
    ("no args", "no args\\['arch'\\]"),
    ("interleaved rotary", "do not record rotary_interleaved=False: its Q/K rows are in the interleaved RoPE order"),
])
def test_mcore_to_hf_bad_input(case, message, round_trip, tmp_path):
    preset = None
    if case == "empty folder":
        src = tmp_path / "empty"
        src.mkdir()
    elif case == "hf folder":
        src = round_trip[0] / "hf"
    elif case == "missing shard":
        src = tmp_path / "partial"
        shutil.copytree(round_trip[0] / "mcore", src)
        os.remove(src / "iter_0000000" / "__1_0.distcp")
    elif case == "other architecture":
        src = tampered_checkpoint(round_trip, tmp_path, num_layers=2)
    elif case == "other vocabulary":
        src = tampered_checkpoint(round_trip, tmp_path, padded_vocab_size=8448, vocab_size=8300)
    elif case == "vocab beyond padding":
        src = tampered_checkpoint(round_trip, tmp_path, vocab_size=9000)
    elif case == "bert-like m0":
        src = tampered_checkpoint(round_trip, tmp_path, **dataclasses.asdict(get_arch("ablation-m0")))
    elif case == "preset mismatch":
        src, preset = round_trip[0] / "mcore", "neobert-tiny"
    elif case == "interleaved rotary":  # as versions before the rotate-half rows wrote
        src = tampered_checkpoint(round_trip, tmp_path)
        rewrite_common_state(src / "iter_0000000", lambda common: checkpoint_args(common).pop("rotary_interleaved"))
    elif case == "no args":
        src = tampered_checkpoint(round_trip, tmp_path)
        rewrite_common_state(src / "iter_0000000", lambda common: common.pop("args"))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ConversionError, match=message):
        mcore_to_hf(src, tmp_path / "out", model_preset=preset)
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no temporary folder left


@pytest.mark.integration
def test_hf_to_mcore_bad_input(round_trip, tmp_path, config, hf_weights):
    with pytest.raises(ConversionError, match="mcore: a trainer checkpoint, not a Hugging Face model folder: export "
                                              "it first with neobert-convert-checkpoint --direction mcore-to-hf"):
        hf_to_mcore(round_trip[0] / "mcore", tmp_path / "a")
    with pytest.raises(ConversionError, match=r"neobert-250m: num_layers=4 \(preset: 28\), hidden_size=64"):
        hf_to_mcore(round_trip[0] / "official", tmp_path / "b", model_preset="neobert-250m")
    with pytest.raises(ConversionError, match=r"^--num-layers 4 \(the model in .*official\) at "
                                              r"--pipeline-model-parallel-size 3: each stage holds an equal share of "
                                              r"the layers, and 3 does not divide 4; use "
                                              r"--pipeline-model-parallel-size 2 or 4$"):
        hf_to_mcore(round_trip[0] / "official", tmp_path / "c", pipeline_model_parallel_size=3)
    bad = dict(hf_weights, **{"model.encoder.weight": torch.zeros(VOCAB_SIZE + 5, 64)})
    with pytest.raises(ConversionError, match="vocab size mismatch"):
        hf_to_mcore(official_folder(tmp_path / "vocab", config, bad), tmp_path / "d")
    with pytest.raises(ConversionError, match="^--load chandar-lab/NeoBERT-not-cached: no folder "
                                              "chandar-lab/NeoBERT-not-cached in .*, nor in the Hugging Face cache .*, "
                                              "and HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE forbid downloading it$"):
        hf_to_mcore("chandar-lab/NeoBERT-not-cached", tmp_path / "e")  # offline in tests
    assert sorted(os.listdir(tmp_path)) == ["vocab"]


@pytest.mark.integration
def test_export_needs_the_tokenizer_unless_told(round_trip, tmp_path):
    """A tokenizer the checkpoint names but this machine lacks is an error naming it; --no-tokenizer exports
    the weights alone, --tokenizer supplies another."""
    cases = [(dict(tokenizer_model="runs/../tok"), r"runs/\.\./tok \(relative: looked up from .*\) is not a folder"),
             (dict(tokenizer_model=str(tmp_path / "gone")), f"tokenizer {tmp_path / 'gone'} is not a folder here"),
             (dict(tokenizer_model="not-a-cached-hub-tokenizer"), "neither a folder in .* nor a hub tokenizer"),
             (dict(tokenizer_type="NullTokenizer"), "args name no Hugging Face tokenizer")]
    for changes, message in cases:
        src = tampered_checkpoint(round_trip, tmp_path, **changes)
        with pytest.raises(ConversionError, match="(?s)" + message + ".*--no-tokenizer"):
            mcore_to_hf(src, tmp_path / "hf")
        assert not (tmp_path / "hf").exists()
        shutil.rmtree(src)
    src = tampered_checkpoint(round_trip, tmp_path, tokenizer_model=str(tmp_path / "gone"))
    mcore_to_hf(src, tmp_path / "bare", no_tokenizer=True)
    bare = set(os.listdir(tmp_path / "bare"))
    assert "model.safetensors" in bare and not bare & set(TOKENIZER_FILES)
    mcore_to_hf(src, tmp_path / "given", tokenizer=SAMPLE_TOKENIZER)
    assert (tmp_path / "given" / "vocab.txt").is_file()
    with pytest.raises(ConversionError, match="contradict"):
        mcore_to_hf(src, tmp_path / "both", tokenizer=SAMPLE_TOKENIZER, no_tokenizer=True)


@pytest.mark.integration
def test_cli_ignores_an_exported_master_port(round_trip, tmp_path):
    """A lone conversion needs no rendezvous even when the shell exports MASTER_PORT (and no RANK)."""
    env = dict(os.environ, MASTER_PORT="29533", PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("RANK", None)
    out = subprocess.run([sys.executable, "tools/convert_checkpoint.py", "--direction", "mcore-to-hf", "--load",
                          str(round_trip[0] / "mcore"), "--save", str(tmp_path / "hf"), "--no-progress"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "28 tensors" in out.stdout and (tmp_path / "hf" / "model.safetensors").is_file()


@pytest.mark.integration
def test_cli_output_to_a_log_is_plain_lines(round_trip, tmp_path):
    """To a pipe (as to a log file): progress as plain lines, without a bar's carriage returns, and none of the
    FutureWarnings megatron-core's checkpointing raises through torch (a user cannot act on them)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "tools/convert_checkpoint.py", "--direction", "mcore-to-hf", "--load",
                          str(round_trip[0] / "mcore"), "--save", str(tmp_path / "hf")], stdin=subprocess.DEVNULL,
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "mcore -> HF: 28/28" in out.stderr and "\r" not in out.stderr and "\x1b[" not in out.stderr
    assert "Warning" not in out.stderr, out.stderr
    # Back to megatron-core on 2 spawned ranks, which import megatron-core before any code of ours runs in them: their
    # import warnings (4 per rank) were silenced there too; the kernel paths are said once.
    back = subprocess.run([sys.executable, "tools/convert_checkpoint.py", "--direction", "hf-to-mcore", "--load",
                           str(tmp_path / "hf"), "--save", str(tmp_path / "mcore"), "--tensor-model-parallel-size", "2"],
                          stdin=subprocess.DEVNULL, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert back.returncode == 0, back.stderr
    assert "Warning" not in back.stderr and back.stderr.count("kernels:") == 1, back.stderr


@pytest.mark.integration
def test_refuses_existing_target_unless_overwrite(round_trip, tmp_path):
    dst = tmp_path / "hf"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="--overwrite"):
        mcore_to_hf(round_trip[0] / "mcore", dst)
    assert os.listdir(dst) == ["keep.txt"]
    mcore_to_hf(round_trip[0] / "mcore", dst, overwrite=True, dtype="bf16")
    sd, _ = read_hf_folder(dst)
    assert not (dst / "keep.txt").exists() and sd["decoder.weight"].dtype == torch.bfloat16
    with pytest.raises(FileExistsError):
        hf_to_mcore(round_trip[0] / "official", round_trip[0] / "mcore")


@pytest.mark.integration
def test_cli(round_trip, tmp_path, capsys, hf_weights):
    out = tmp_path / "bf16"
    assert cli(["--direction", "mcore-to-hf", "--load", str(round_trip[0] / "mcore"), "--save", str(out),
                "--dtype", "bf16", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "mcore-to-hf: wrote" in printed and "28 tensors" in printed and "bf16" in printed
    sd, _ = read_hf_folder(out)
    assert torch.equal(sd["decoder.weight"], hf_weights["decoder.weight"].to(torch.bfloat16))

    assert cli(["--direction", "mcore-to-hf", "--load", str(tmp_path / "nowhere"), "--save",
                str(tmp_path / "x")]) == 1
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "x").exists()
    with pytest.raises(SystemExit):  # a layout only makes sense for the Megatron target
        cli(["--direction", "mcore-to-hf", "--load", "a", "--save", "b", "--tensor-model-parallel-size", "2"])
