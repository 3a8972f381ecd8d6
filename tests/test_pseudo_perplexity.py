"""Pseudo-perplexity: a hand-checkable case, the direct per-position computation, batching, buckets, RoPE scaling."""

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hf_fixtures import VOCAB, make_neobert_folder, random_mlm_state_dict, tiny_config
from megatron_neobert.hf import NeoBERTLMHead
from megatron_neobert.evaluation.pseudo_perplexity import (SequenceResult, bucket_results, load_mlm, load_texts,
                                                           masked_token_losses, pseudo_perplexities)

REPO = Path(__file__).resolve().parents[1]
MASK = VOCAB.index("[MASK]")
TEXT = "the quick dog jumps over the lazy cat and the bird sings in the old tree by the river"



@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_neobert_folder(tmp_path_factory.mktemp("pppl") / "neobert", seed=3, scale=0.2)


@pytest.fixture(scope="module")
def tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)


def test_hand_checkable_constant_predictor(tmp_path, tokenizer):
    """A zero decoder matrix makes the logits equal the decoder bias b at every position, whatever the input:
    the loss of token t is logsumexp(b) - b[t], so the pseudo-perplexity can be written down directly."""
    config = tiny_config()
    sd = random_mlm_state_dict(config)
    sd["decoder.weight"] = torch.zeros_like(sd["decoder.weight"])
    bias = torch.zeros(config.vocab_size)
    bias[VOCAB.index("the")], bias[VOCAB.index("cat")] = math.log(4.0), math.log(2.0)  # others: log 1 = 0
    sd["decoder.bias"] = bias
    model = load_mlm(make_neobert_folder(tmp_path / "constant", state_dict=sd))

    text = "the cat the dog"  # [CLS] the cat the dog [SEP]; Z = 4 + 2 + (V - 2)
    z = 4 + 2 + (config.vocab_size - 2)
    expected_losses = [math.log(z / 4), math.log(z / 2), math.log(z / 4), math.log(z / 1)]
    [result] = pseudo_perplexities(model, tokenizer, [text], max_length=64, batch_size=3, progress=False)
    assert (result.length, result.scored) == (6, 4)
    assert result.mean_loss == pytest.approx(sum(expected_losses) / 4, rel=1e-6)
    assert result.pseudo_perplexity == pytest.approx(z / (4 * 2 * 4 * 1) ** 0.25, rel=1e-6)


def test_equals_direct_computation_and_batching_does_not_matter(folder, tokenizer):
    model = load_mlm(folder)
    ids = tokenizer(TEXT)["input_ids"]
    positions = list(range(1, len(ids) - 1))
    direct = []
    for p in positions:  # one full forward per position, logits of the whole sequence
        masked = torch.tensor([ids])
        masked[0, p] = MASK
        with torch.no_grad():
            logits = model(input_ids=masked).logits[0, p]
        direct.append(F.cross_entropy(logits[None], torch.tensor([ids[p]])).item())
    direct = torch.tensor(direct)
    for batch_size in (1, 5, len(positions), 1000):
        torch.testing.assert_close(masked_token_losses(model, ids, positions, MASK, batch_size), direct,
                                   rtol=1e-5, atol=1e-5)
    [result] = pseudo_perplexities(model, tokenizer, [TEXT], max_length=64, batch_size=7, progress=False)
    assert result.mean_loss == pytest.approx(direct.mean().item(), rel=1e-5)


def test_buckets_are_token_weighted():
    results = [SequenceResult(0, 10, 8, 1.0), SequenceResult(1, 12, 10, 2.0), SequenceResult(2, 40, 38, 3.0)]
    rows = bucket_results(results, [16, 32, 64])
    assert [(r["min_length"], r["max_length"], r["sequences"], r["tokens"]) for r in rows] == [(1, 16, 2, 18),
                                                                                                 (33, 64, 1, 38)]
    assert rows[0]["mean_loss"] == pytest.approx((8 * 1.0 + 10 * 2.0) / 18)
    assert rows[0]["pseudo_perplexity"] == pytest.approx(math.exp(28 / 18))
    with pytest.raises(ValueError, match="longer than the last bucket edge 32"):
        bucket_results(results, [16, 32])


def test_rope_scaling_past_trained_length(folder, tokenizer):
    long_text = " ".join([TEXT] * 6)  # ~120 tokens, the model was configured for 64
    ids = tokenizer(long_text, truncation=True, max_length=128)["input_ids"]
    assert len(ids) == 128
    positions = list(range(1, 127, 9))
    plain = masked_token_losses(load_mlm(folder), ids, positions, MASK, batch_size=8)
    scaled_model = load_mlm(folder, {"rope_type": "yarn", "factor": 2.0})
    assert scaled_model.config.rope_parameters["rope_type"] == "yarn"
    assert scaled_model.config.rope_parameters["original_max_position_embeddings"] == 64
    scaled = masked_token_losses(scaled_model, ids, positions, MASK, batch_size=8)
    # the same weights in a model built with the scaled config directly
    reference = NeoBERTLMHead(tiny_config(rope_parameters={"rope_type": "yarn", "factor": 2.0})).eval()
    reference.load_state_dict(random_mlm_state_dict(tiny_config(), seed=3, scale=0.2))
    torch.testing.assert_close(scaled, masked_token_losses(reference, ids, positions, MASK, batch_size=3),
                               rtol=1e-5, atol=1e-5)
    assert (scaled - plain).abs().max() > 1e-2  # positions past 64 really are encoded differently
    with pytest.raises(ValueError, match="RoPE scaling"):
        load_mlm(folder, {"rope_type": "ntk", "factor": 2.0})


def test_not_neobert_folder(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is not NeoBERT-compatible: model_type='bert'"):
        load_mlm(tmp_path)


def test_text_sources(tmp_path):
    texts = ["first text", "second text with more words", "third"]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"body": t}) for t in texts) + "\n")
    (tmp_path / "a.txt").write_text("\n".join(texts) + "\n\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet")
    assert load_texts(tmp_path / "a.jsonl", text_field="body") == texts
    assert load_texts(tmp_path / "a.txt", limit=2) == texts[:2]
    assert load_texts(tmp_path / "a.parquet") == texts
    with pytest.raises(ValueError, match="line 1 has no field 'text'"):
        load_texts(tmp_path / "a.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist"):
        load_texts(tmp_path / "missing.jsonl")


def test_tool_end_to_end(folder, tmp_path):
    from tools.pseudo_perplexity import main

    texts = [" ".join([TEXT] * k) for k in (1, 2, 3)] + ["cat"]  # ~21, ~40, ~59 and 3 tokens
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    buckets = main(["--model", str(folder), "--texts", str(tmp_path / "docs.jsonl"), "--max_length", "96",
                    "--buckets", "16", "32", "48", "--batch_size", "16", "--rope_scaling", "dynamic", "--rope_factor",
                    "1.5", "--output", str(tmp_path / "out" / "pppl"), "--device", "cpu", "--no_progress"])
    assert [(b["max_length"], b["sequences"]) for b in buckets] == [(16, 1), (32, 1), (48, 1), (96, 1)]
    with open(tmp_path / "out" / "pppl.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["pseudo_perplexity"]) for r in rows] == pytest.approx([b["pseudo_perplexity"] for b in buckets])
    with open(tmp_path / "out" / "pppl_sequences.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    from PIL import Image

    assert Image.open(tmp_path / "out" / "pppl.png").text["Title"] == (
        f"Pseudo-perplexity by length: {folder.name}\n4 texts of docs.jsonl, up to 96 tokens, dynamic RoPE x1.5")


@pytest.mark.integration
def test_tool_writes_plain_progress_lines_to_a_log(folder, tmp_path):
    """With output to a pipe (as to a log file), progress is plain lines: no bar's carriage returns or cursor
    codes, no "Loading weights" bar of transformers; --no-progress silences both. No prompt to run the export's
    code (stdin is closed, as in a batch job)."""
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": TEXT}) for _ in range(2)) + "\n")
    command = [sys.executable, "tools/pseudo_perplexity.py", "--model", str(folder), "--texts",
               str(tmp_path / "docs.jsonl"), "--max-length", "32", "--buckets", "16", "--output",
               str(tmp_path / "pppl"), "--device", "cpu"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + sys.path))
    for extra in ([], ["--no-progress"]):
        out = subprocess.run(command + extra, cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert ("pseudo-perplexity: 2/2" in out.stderr) == (not extra), out.stderr[-3000:]
        assert "\r" not in out.stdout + out.stderr and "\x1b[" not in out.stdout + out.stderr
        assert "Loading weights" not in out.stderr and "2 seqs  pppl" in out.stdout
        assert "custom code" not in out.stdout + out.stderr
