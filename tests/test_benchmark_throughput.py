"""The throughput benchmark runs in its CPU mode (no timing asserts) and its accounting is right."""

import json
import os
import sys

import torch

from megatron_neobert.evaluation.throughput import document_lengths, mlm_batch, training_flops_per_token
from megatron_neobert.model import get_arch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))


def test_cpu_smoke_run_writes_every_row_json_and_png(tmp_path):
    import benchmark_throughput

    out_json, out_png = tmp_path / "t.json", tmp_path / "t.png"
    benchmark_throughput.main(["--cpu-smoke", "--output-json", str(out_json), "--output-png", str(out_png)])
    rows = json.loads(out_json.read_text())["results"]
    models = {(r["benchmark"], r["model"]) for r in rows}
    assert {("inference", m) for m in ("neobert-hf", "neobert-megatron", "modernbert-base", "bert-base")} <= models
    assert {("training", m) for m in ("reference-hf-padded", "megatron-padded", "megatron-packed")} <= models
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert [r["ratio_to_baseline"] for r in rows if r["model"] == "reference-hf-padded"] == [1.0]
    assert out_png.stat().st_size > 10_000


def test_training_flops_per_token_follows_the_spec_formula():
    arch = get_arch("neobert-250m")
    non_embedding = 28 * (4 * 768 * 768 + 3 * 768 * 2048)  # = 198.2M, the 250M model's layers
    assert non_embedding == 221_665_536 - 30522 * 768 - 768 - 28 * 2 * 768
    expected = 6 * non_embedding + 12 * 28 * 768 * 1024 + 6 * 768 * 30522 * 0.2
    assert training_flops_per_token(arch, 1024, 0.2) == expected


def test_packed_benchmark_batches_fill_rows_and_keep_documents_inside_them():
    lengths = document_lengths(128, 6)
    packed = mlm_batch(lengths, 128, 1000, packed=True, mask_rate=0.2)
    cu = packed["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == 6 * 128
    assert all((a // 128) == ((b - 1) // 128) for a, b in zip(cu, cu[1:])), "a document crosses a row"
    padded = mlm_batch(lengths, 128, 1000, packed=False, mask_rate=0.2)
    assert padded["attention_mask"].sum(1).tolist() == lengths
    assert (padded["labels"][~padded["attention_mask"]] == -100).all()
    assert torch.equal(packed["tokens"] == 4, packed["labels"] != -100)
