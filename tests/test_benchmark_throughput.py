"""The throughput benchmark runs in its CPU mode (no timing asserts), its accounting is right, and
it judges the project's targets from its measurements."""

import dataclasses
import json
import math
import sys

import pytest
import torch

from megatron_neobert.evaluation.throughput import (FP8_COMPARED_FROM_STEP, Measurement, _attempt, document_lengths,
                                                    format_table, fp8_loss_gap, mlm_batch, plot, table_cells,
                                                    training_runs)
from megatron_neobert.model import ModelShape, padded_vocab_size
from megatron_neobert.training.reporting.metrics import step_flops
from tools import benchmark_throughput
from tools.benchmark_throughput import check_targets, format_markdown

# The tool runs in this process: tiny models on shared cores (no timing asserts).
H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.integration  # the tool end to end: a minute or more on 2 cores
def test_cpu_smoke_run_with_compiled_variants_writes_json_png_and_markdown(tmp_path, monkeypatch):
    # Inductor's code generation takes minutes on CPU even at these sizes, so the compiled variants go through
    # dynamo for real (graph capture, guards, graph breaks) and run the captured graphs with the eager backend.
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model=None, **kwargs: real_compile(model, backend="eager"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    out_json, out_png, out_md = tmp_path / "t.json", tmp_path / "t.png", tmp_path / "t.md"
    benchmark_throughput.main(["--cpu-smoke", "--compile", "--output-json", str(out_json),
                               "--output-png", str(out_png), "--markdown", str(out_md)])
    report = json.loads(out_json.read_text())
    rows = report["results"]
    labels = {(r["benchmark"], r["label"]) for r in rows}
    for model in ("neobert-hf", "neobert-megatron", "modernbert-base", "bert-base"):
        assert {("inference", model), ("inference", model + "+compile")} <= labels
    assert {("training", m) for m in ("reference-hf-padded", "reference-hf-padded+compile", "megatron-padded",
                                      "megatron-packed", "megatron-packed+compile")} <= labels
    assert all(r["error"] is None and r["tokens_per_s"] > 0 and r["peak_memory_gib"] is None for r in rows)
    assert all(r["micro_batches"] == 2 for r in rows if r["benchmark"] == "training")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # dynamo captured the compiled variants
    eager = {(r["benchmark"], r["model"], r["seq_length"]): r["tokens_per_s"] for r in rows if not r["compiled"]}
    for r in rows:
        if r["compiled"]:  # each compiled variant against its own eager model at the same length
            ratio = r["tokens_per_s"] / eager[(r["benchmark"], r["model"], r["seq_length"])]
            assert r["ratio_to_eager"] == pytest.approx(ratio, rel=1e-3)
    assert [r["ratio_to_baseline"] for r in rows if r["label"] == "reference-hf-padded"] == [1.0]
    # FLOPs per real token: the reference's head runs on every token, ours on the masked ones only.
    arch = benchmark_throughput.smoke_arch()
    per_token = {r["label"]: r["tflops_per_gpu"] * 1e12 / r["tokens_per_s"] for r in rows if r["tflops_per_gpu"]}
    # Attention counted per document: below every token attending all 64 positions.
    assert (step_flops(arch, 1, 1, 0, arch.vocab_size) < per_token["reference-hf-padded"]
            < step_flops(arch, 1, 1, 64, arch.vocab_size))
    assert per_token["megatron-packed"] < step_flops(arch, 1, 0.3, 64, padded_vocab_size(arch.vocab_size))
    assert len(report["targets"]) == 4 and all(t["status"].startswith("not measured") for t in report["targets"])
    assert out_png.stat().st_size > 10_000
    markdown = out_md.read_text()
    assert "| training | megatron-packed+compile | 64 | 2x2 |" in markdown
    assert "| inference tokens/s vs ModernBERT-base, length 4096 | - | >= 1.5x | not measured" in markdown


def test_quick_mode_sets_the_target_lengths_few_steps_and_no_compile_and_explicit_flags_win():
    args = benchmark_throughput.parse_args(["--quick"])
    assert args.inference_seq_lengths == args.train_seq_lengths == [1024, 4096] and not args.compile
    assert (args.inference_steps, args.train_steps, args.train_tokens_per_micro_batch) == (5, 5, 32768)
    assert benchmark_throughput.parse_args(["--quick", "--train-steps", "9"]).train_steps == 9
    assert benchmark_throughput.parse_args([]).inference_seq_lengths == [512, 1024, 2048, 4096, 8192]


@pytest.mark.integration
def test_quick_run_attempts_every_row_writes_each_as_it_finishes_and_skips_a_plot_without_matplotlib(
        tmp_path, monkeypatch, capsys):
    import megatron_neobert.evaluation.throughput as throughput

    measure_inference, measure_training = throughput._measure_inference, throughput._measure_training

    def inference(row, *args):
        if (row.model, row.seq_length) == ("neobert-megatron", 128):
            raise RuntimeError("TE's first call under inference_mode")
        return measure_inference(row, *args)

    def training(row, *args):
        if (row.model, row.seq_length) == ("megatron-padded", 128):
            raise ValueError("a failing eager row")
        if (row.model, row.seq_length) == ("megatron-packed", 256):
            raise KeyboardInterrupt  # the time limit's SIGTERM, as conftest.py and pytest turn it
        return measure_training(row, *args)

    monkeypatch.setattr(throughput, "_measure_inference", inference)
    monkeypatch.setattr(throughput, "_measure_training", training)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    out_json, out_png, out_md = tmp_path / "q.json", tmp_path / "q.png", tmp_path / "q.md"
    # As examples/benchmark_gpu.sh runs it, with CPU-sized lengths, batches and step counts.
    argv = ["--quick", "--fp8", "--model-preset", "neobert-tiny", "--no-baselines",
            "--inference-seq-lengths", "128", "256", "--inference-max-batch", "2", "--inference-steps", "1",
            "--train-seq-lengths", "128", "256", "--train-tokens-per-micro-batch", "512", "--train-steps", "1",
            "--output-json", str(out_json), "--output-png", str(out_png), "--markdown", str(out_md)]
    with pytest.raises(KeyboardInterrupt):
        benchmark_throughput.main(argv)
    # Every row up to the one the limit stopped, written as each finished; the failing ones with their errors.
    rows = {(r["benchmark"], r["label"], r["seq_length"]): r for r in json.loads(out_json.read_text())["results"]}
    assert list(rows) == [("inference", "neobert-hf", 128), ("inference", "neobert-megatron", 128),
                          ("inference", "neobert-hf", 256), ("inference", "neobert-megatron", 256),
                          ("training", "reference-hf-padded", 128), ("training", "megatron-padded", 128),
                          ("training", "megatron-packed", 128), ("training", "megatron-packed-fp8", 128),
                          ("training", "reference-hf-padded", 256), ("training", "megatron-padded", 256)]
    errors = {key: row["error"] for key, row in rows.items() if row["error"]}
    assert errors == {("inference", "neobert-megatron", 128):
                      "failed: RuntimeError: TE's first call under inference_mode",
                      ("training", "megatron-padded", 128): "failed: ValueError: a failing eager row",
                      ("training", "megatron-packed-fp8", 128): "not run: no GPU"}
    assert "| training | megatron-padded | 256 | 2 |" in out_md.read_text()
    # The same tokens per micro-batch at each length.
    assert {(r["seq_length"], r["batch_size"]) for r in rows.values() if r["benchmark"] == "training"} == {
        (128, 4), (256, 2)}

    monkeypatch.setattr(throughput, "_measure_training", measure_training)
    benchmark_throughput.main(argv + ["--skip-inference"])
    assert f"no plot ({out_png}): matplotlib is not installed" in capsys.readouterr().out
    assert not out_png.exists() and len(json.loads(out_json.read_text())["results"]) == 8

    # A plot that fails for another reason fails the run, after the figures.
    monkeypatch.delitem(sys.modules, "matplotlib")
    monkeypatch.setattr(throughput, "plot", lambda results, path: pytest.fail("plotted with --no-plot"))
    benchmark_throughput.main(argv + ["--no-plot", "--skip-inference", "--skip-training"])
    monkeypatch.setattr(throughput, "plot", lambda results, path: (_ for _ in ()).throw(RuntimeError("no display")))
    with pytest.raises(RuntimeError, match="no display"):
        benchmark_throughput.main(argv + ["--skip-inference", "--skip-training"])
    assert json.loads(out_json.read_text())["results"] == [] and not out_png.exists()


def test_training_runs_put_each_compiled_variant_after_its_eager_model():
    assert training_runs(fp8=False, compile=False) == [
        ("reference-hf-padded", "bf16", False), ("megatron-padded", "bf16", False), ("megatron-packed", "bf16", False)]
    assert training_runs(fp8=True, compile=True) == [
        ("reference-hf-padded", "bf16", False), ("reference-hf-padded", "bf16", True),
        ("megatron-padded", "bf16", False), ("megatron-packed", "bf16", False), ("megatron-packed", "bf16", True),
        ("megatron-packed", "fp8", False)]


def test_an_optional_variant_that_fails_becomes_a_row_with_its_reason(caplog):
    def broken():
        raise RuntimeError("graph break\nmore detail")

    caplog.set_level("INFO", logger="megatron_neobert.evaluation.throughput")
    row = _attempt(broken, Measurement("training", "megatron-packed", 1024, 32, 0.0, compiled=True), optional=True)
    assert row.error == "failed: RuntimeError: graph break"
    # Logged as it is measured (a run stopped by a time limit keeps it), as is a figure.
    assert "measured: training | megatron-packed+compile | 1024 | 32 | failed: RuntimeError: graph break" in caplog.text
    measured = Measurement("training", "megatron-packed", 1024, 32, 1234.0)
    assert _attempt(lambda: measured, measured, optional=False) is measured
    assert "measured: training | megatron-packed | 1024 | 32 | 1,234 | - | - | - | - | -" in caplog.text
    with pytest.raises(RuntimeError):
        _attempt(broken, Measurement("training", "megatron-packed", 1024, 32, 0.0), optional=False)
    assert "failed: RuntimeError: graph break" in format_table([row])


def test_an_fp8_rows_mfu_is_labelled_with_its_peak_and_given_against_bf16s_too():
    fp8 = Measurement("training", "megatron-packed", 1024, 32, 50_000.0, "fp8", tflops_per_gpu=660.0, mfu=1 / 3,
                      mfu_of_bf16_peak=2 / 3)
    bf16 = dataclasses.replace(fp8, precision="bf16", mfu=0.5, mfu_of_bf16_peak=None)
    assert table_cells(fp8)[8] == "33.3% of FP8 peak, 66.7% of bf16" and table_cells(bf16)[8] == "50.0%"


def test_the_trainers_rows_record_the_same_losses_from_the_same_seed_and_batches():
    # What makes the FP8 row's losses comparable with its bf16 row's: every row builds its model from the run's
    # seed and repeats the same micro-batches, so a row built again records the same losses, step by step.
    from megatron_neobert.cli import megatron_runtime
    from megatron_neobert.evaluation.throughput import benchmark_training

    with megatron_runtime():
        first, again = (benchmark_training(benchmark_throughput.smoke_arch(), 64, 2, steps=2, micro_batches=2)
                        for _ in range(2))
    losses = {r.model: r.losses for r in first}
    assert losses["reference-hf-padded"] is None  # another model and initialisation: not comparable
    for model in ("megatron-padded", "megatron-packed"):
        assert len(losses[model]) == 4 and all(math.isfinite(x) for x in losses[model])  # warm-up steps included
        assert losses[model][-1] < losses[model][0]  # the same micro-batches, learnt
    assert [r.losses for r in again] == [r.losses for r in first]


def test_the_trainers_rows_time_the_trainers_own_train_step(monkeypatch):
    """The benchmark's figures are the trainer's: each step it times is one call of train_step on its batches, whose
    loss it records (a step of its own, which could drift from the trainer's, fails here)."""
    from megatron_neobert.cli import megatron_runtime
    from megatron_neobert.evaluation import throughput
    from megatron_neobert.training.engine import train_step

    calls = []

    def recorded(*args, **kwargs):
        record = trainers_step(*args, **kwargs)
        calls.append((args[4], record["loss"]))  # the batches it stepped on, the loss it gave
        return record

    trainers_step = train_step.train_step
    monkeypatch.setattr(train_step, "train_step", recorded)
    arch = benchmark_throughput.smoke_arch()
    shape = ModelShape(arch, padded_vocab_size(arch.vocab_size), preset=None, base="the smoke arch")
    batches = throughput.mlm_micro_batches(32, 2, 2, arch.vocab_size, True, 0.2, torch.device("cpu"))
    losses = []
    with megatron_runtime():
        step = throughput._megatron_train_step(shape, batches, fp8=False, compiled=False, losses=losses)
        step()
        step()
    assert len(calls) == 2 and all(stepped is batches for stepped, _ in calls)
    assert losses == [loss for _, loss in calls] and losses[1] < losses[0]


def _row(benchmark, model, tokens_per_s, seq=1024, precision="bf16", compiled=False, mfu=None, error=None,
         losses=None):
    return Measurement(benchmark, model, seq, 32, tokens_per_s, precision, compiled, mfu=mfu, error=error,
                       losses=losses)


BF16_LOSSES = [10.0, 9.0, 8.0, 7.0, 6.0]


def _h100_run(mfu=0.5, fp8_speed=52_000, megatron_speed=40_000, neobert_speed=18_000,
              fp8_losses=(10.6, 9.5, 8.08, 7.07, 6.03)):  # steps 1-2 at FP8's initial scales: not compared
    return [_row("training", "reference-hf-padded", 10_000),
            _row("training", "megatron-padded", 25_000, mfu=0.3),
            _row("training", "megatron-packed", megatron_speed, mfu=mfu, losses=BF16_LOSSES),
            _row("training", "megatron-packed", fp8_speed, precision="fp8", mfu=0.33,
                 losses=list(fp8_losses) if fp8_losses else None),
            _row("inference", "neobert-hf", neobert_speed, seq=4096),
            _row("inference", "modernbert-base", 11_000, seq=4096)]


def test_targets_pass_with_the_figures_and_rows_they_come_from():
    checks = check_targets(_h100_run(), H100, "neobert-250m")
    assert [c.status for c in checks] == ["PASS"] * 4
    assert [c.measured for c in checks] == [
        "50.0% (megatron-packed)",
        "1.30x (megatron-packed-fp8 / megatron-packed), losses within 1.0% over steps 3-5",  # the largest gap
        "4.00x (megatron-packed)",  # bf16 against the bf16 reference: FP8 does not count here
        "1.64x (neobert-hf / modernbert-base)"]
    assert [c.threshold for c in checks] == [">= 50%", ">= 1.25x, losses within 2%", ">= 3.0x", ">= 1.5x"]


def test_targets_fail_below_their_thresholds():
    run = _h100_run(mfu=0.49, fp8_speed=36_000, megatron_speed=29_000, neobert_speed=16_000)
    checks = check_targets(run, "NVIDIA H200", "neobert-250m")
    assert [c.status for c in checks] == ["FAIL"] * 4
    assert checks[1].measured.startswith("1.24x") and checks[2].measured.startswith("2.90x")


def test_fp8_fails_when_its_losses_drift_from_bf16_or_were_not_recorded():
    drifted = check_targets(_h100_run(fp8_losses=(10.0, 9.0, 8.0, 7.0, 6.15)), H100, "neobert-250m")[1]
    assert (drifted.measured, drifted.status) == (
        "1.30x (megatron-packed-fp8 / megatron-packed), losses within 2.5% over steps 3-5", "FAIL")
    for losses in (None, (10.0, 9.0, 8.0, 7.0)):  # none, or not as many steps as bf16's
        unknown = check_targets(_h100_run(fp8_losses=losses), H100, "neobert-250m")[1]
        assert (unknown.measured, unknown.status) == (
            "1.30x (megatron-packed-fp8 / megatron-packed), losses not recorded", "FAIL")


def test_fp8_losses_are_compared_with_bf16s_from_the_step_its_scales_are_set():
    bf16 = [6.9, 6.5, 6.2, 6.0, 5.9, 5.8]
    # 5% off at steps 1-2 (scale 1, then the update made at it), within 1% after: the test's 2% holds.
    assert fp8_loss_gap([7.25, 6.83, 6.26, 6.05, 5.93, 5.83], bf16) == pytest.approx(0.01, abs=1e-3)
    # Off by 3% at the last step: caught.
    assert fp8_loss_gap([6.9, 6.5, 6.2, 6.0, 5.9, 5.974], bf16) == pytest.approx(0.03)
    assert FP8_COMPARED_FROM_STEP == 3
    for fp8 in ([], [6.9, 6.5, 6.2, 6.0, 5.9], None):  # not recorded, or not as many steps
        assert fp8_loss_gap(fp8, bf16) is None
    assert fp8_loss_gap([7.0, 6.6], [6.9, 6.5]) is None  # no step compared


def test_targets_compare_best_against_best_including_compiled_variants():
    run = _h100_run() + [_row("inference", "modernbert-base", 13_000, seq=4096, compiled=True),
                         _row("inference", "neobert-hf", 19_500, seq=4096, compiled=True)]
    assert check_targets(run, H100, "neobert-250m")[3].measured == (
        "1.50x (neobert-hf+compile / modernbert-base+compile)")


def test_targets_say_why_they_were_not_measured():
    run = [r for r in _h100_run() if r.precision != "fp8" and r.benchmark == "training"]
    statuses = [c.status for c in check_targets(run, H100, "neobert-250m")]
    assert statuses == ["PASS", "not measured (no FP8 run (--fp8))", "PASS",
                        "not measured (inference at length 4096 not run)"]

    run.append(_row("training", "megatron-packed", 0.0, precision="fp8",
                    error="not run: Transformer Engine does not import"))
    assert check_targets(run, H100, "neobert-250m")[1].status == (
        "not measured (megatron-packed-fp8 not run: Transformer Engine does not import)")

    at_4096 = [_row("training", "megatron-packed", 40_000, seq=4096, mfu=0.5)]
    assert check_targets(at_4096, H100, "neobert-250m")[0].status == (
        "not measured (training at length 1024 not run)")


def test_figures_from_another_machine_or_model_are_shown_but_not_judged():
    cpu = [_row("training", "reference-hf-padded", 100, precision="fp32"),
           _row("training", "megatron-packed", 400, precision="fp32")]
    checks = check_targets(cpu, "cpu", "neobert-tiny")
    assert checks[0].status == "not measured (no peak TFLOP/s known for cpu)"
    assert checks[2].measured == "4.00x (megatron-packed)"
    assert checks[2].status == ("not measured (targets are for neobert-250m on one H100/H200; "
                                "this run: neobert-tiny on cpu)")
    assert check_targets(_h100_run(), "NVIDIA A100-SXM4-80GB", "neobert-250m")[0].status.startswith(
        "not measured (targets are for")


def test_markdown_holds_every_row_and_target_as_table_rows():
    run = _h100_run() + [_row("training", "megatron-packed", 0.0, compiled=True, error="out of memory")]
    checks = check_targets(run, H100, "neobert-250m")
    markdown = format_markdown(run, checks, dict(device=H100, torch="2.x", command="python tools/x.py"))
    lines = markdown.splitlines()
    assert lines[0] == f"Measured on {H100} (torch 2.x): `python tools/x.py`"
    assert "| training | megatron-packed+compile | 1024 | 32 | out of memory |  |  |  |  |  |" in lines
    assert "| training MFU, bf16, length 1024 | 50.0% (megatron-packed) | >= 50% | PASS |" in lines
    assert sum(line.startswith("|") for line in lines) == 2 + len(run) + 2 + len(checks)


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


def test_plot_ticks_the_measured_lengths(tmp_path):
    rows = [_row("inference", "neobert-hf", 1000.0, seq=seq) for seq in (64, 128, 512)]
    axes = plot(rows + [_row("training", "megatron-packed", 500.0, seq=64)], str(tmp_path / "p.png"))
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["64", "128", "512"]
    assert list(axes[0].get_xticks()) == [64, 128, 512] and axes[0].get_xscale() == "log"
    assert (tmp_path / "p.png").stat().st_size > 10_000
