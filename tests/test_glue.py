"""GLUE: task readers, metrics against scikit-learn/SciPy, the fine-tuning protocol, grids and MNLI transfer."""

import json
import os
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hf_fixtures import make_neobert_folder, random_mlm_state_dict, tiny_config
from megatron_neobert.conversion.hf_format import write_hf_folder
from megatron_neobert.evaluation import glue_grid
from megatron_neobert.evaluation.glue import PAPER_GRID, Protocol, RunSpec, eval_interval, fine_tune, load_classifier
from megatron_neobert.evaluation.glue_data import TASKS, get_task, load_split, read_tsv_split
from megatron_neobert.evaluation.glue_grid import best_mnli_checkpoint, grid_specs, preset_specs, run_glue
from megatron_neobert.evaluation.glue_metrics import (PAPER_AVERAGE, PAPER_SCORES, accuracy, f1_binary, glue_average,
                                                      matthews_corrcoef, pearson, spearman, task_metrics)

FILLER = "the a of cat dog bird tree river city house road car small big old new".split()
# A keyword per class decides the label, so a tiny model can learn each task in a few dozen steps.
KEYWORDS = {2: ["bad", "good"], 3: ["red", "green", "blue"]}
STS_KEYWORDS = ["bad", "new", "good"]


def _sentence(rng, keyword=None, n=5):
    words = [rng.choice(FILLER) for _ in range(n)]
    if keyword:
        words.insert(rng.randrange(n), keyword)
    return " ".join(words)


def write_glue_folder(root, n_train=48, n_dev=24, seed=0):
    """Small TSV files in the original GLUE layouts (header names, CoLA without header, MNLI label1/gold_label)."""
    rng = random.Random(seed)

    def rows(n, classes):
        out = []
        for i in range(n):
            y = i % classes
            out.append((y, _sentence(rng), _sentence(rng, KEYWORDS[classes][y])))
        return out

    def write(task, name, header, lines):
        folder = root / task
        folder.mkdir(parents=True, exist_ok=True)
        text = ([("\t".join(header))] if header else []) + ["\t".join(map(str, line)) for line in lines]
        (folder / name).write_text("\n".join(text) + "\n", encoding="utf-8")

    for split, n in (("train", n_train), ("dev", n_dev)):
        write("SST-2", f"{split}.tsv", ["sentence", "label"], [(b, y) for y, _, b in rows(n, 2)])
        write("CoLA", f"{split}.tsv", None, [("gj04", y, "*" if not y else "", b) for y, _, b in rows(n, 2)])
        write("RTE", f"{split}.tsv", ["index", "sentence1", "sentence2", "label"],
              [(i, a, b, ["entailment", "not_entailment"][y]) for i, (y, a, b) in enumerate(rows(n, 2))])
        # STS-B: one of three keywords in sentence2 sets the score (0, 2.5 or 5).
        sts = [(i, "main-captions", "MSRvid", "2012test", i, "none", "none", _sentence(rng),
                _sentence(rng, STS_KEYWORDS[i % 3]), f"{2.5 * (i % 3):.3f}") for i in range(n)]
        write("STS-B", f"{split}.tsv", ["index", "genre", "filename", "year", "old_index", "source1", "source2",
                                        "sentence1", "sentence2", "score"], sts)
    mnli_header = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                   "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
    names = ["entailment", "neutral", "contradiction"]
    for split, n in (("train", n_train), ("dev_matched", n_dev), ("dev_mismatched", n_dev)):
        write("MNLI", f"{split}.tsv", mnli_header,
              [(i, i, f"{i}e", "fiction", "( a )", "( b )", "(ROOT a)", "(ROOT b)", a, b, names[(y + 1) % 3], names[y])
               for i, (y, a, b) in enumerate(rows(n, 3))])
    return root



@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_neobert_folder(tmp_path_factory.mktemp("model") / "neobert", seed=0, num_hidden_layers=1)


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    return write_glue_folder(tmp_path_factory.mktemp("glue"))



# ------------------------------------------------------------------------------------------------
# Tasks and readers
# ------------------------------------------------------------------------------------------------


def test_task_names():
    assert list(TASKS) == ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE"]
    assert get_task("stsb").name == get_task("STS-B").name == get_task("sts_b").name == "STS-B"
    assert {t.name for t in TASKS.values() if t.transfer_from_mnli} == {"RTE", "STS-B", "MRPC", "QNLI"}
    with pytest.raises(ValueError, match="WNLI is excluded"):
        get_task("WNLI")
    with pytest.raises(ValueError, match="unknown GLUE task 'SQuAD'"):
        get_task("SQuAD")


def test_tsv_layouts(glue_dir):
    mnli = load_split(get_task("mnli"), "dev_mismatched", glue_dir)
    lines = (glue_dir / "MNLI" / "dev_mismatched.tsv").read_text().splitlines()[1:]
    # gold_label (last column), not label1, is the label; indices follow nyu-mll/glue
    gold = [("entailment", "neutral", "contradiction").index(line.split("\t")[-1]) for line in lines]
    assert mnli.labels == gold and mnli.text_b[0] == lines[0].split("\t")[9]
    cola = load_split(get_task("CoLA"), "train", glue_dir)
    assert cola.text_b is None and cola.text_a[0] == (glue_dir / "CoLA/train.tsv").read_text().split("\n")[0].split("\t")[3]
    sts = load_split(get_task("STS-B"), "dev", glue_dir)
    assert all(isinstance(v, float) for v in sts.labels) and max(sts.labels) == 5.0
    rte = load_split(get_task("RTE"), "train", glue_dir)
    assert set(rte.labels) == {0, 1} and len(rte) == 48
    with pytest.raises(ValueError, match="RTE has splits train, dev"):
        load_split(get_task("RTE"), "test", glue_dir)


def test_bad_tsv(tmp_path):
    bad = tmp_path / "train.tsv"
    bad.write_text("index\tsentence1\tlabel\n0\ta\tentailment\n")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['sentence2'\]"):
        read_tsv_split(get_task("RTE"), bad)
    bad.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\n")
    with pytest.raises(ValueError, match="line 3 has 2 column"):
        read_tsv_split(get_task("RTE"), bad)
    bad.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(ValueError, match="line 2: label 'maybe' is not one of"):
        read_tsv_split(get_task("RTE"), bad)
    bad.write_text("gj04\t1\n")
    with pytest.raises(ValueError, match="CoLA.*line 1 has 2 column"):
        read_tsv_split(get_task("CoLA"), bad)
    # QQP's original train.tsv has truncated lines, which are skipped rather than fatal
    bad.write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n0\t1\t2\tq a\tq b\t1\n1\t3\t4\tbroken\n")
    assert read_tsv_split(get_task("QQP"), bad).labels == [1]
    with pytest.raises(FileNotFoundError, match="MRPC"):
        load_split(get_task("MRPC"), "train", tmp_path)


# ------------------------------------------------------------------------------------------------
# Metrics
# ------------------------------------------------------------------------------------------------


def test_metrics_on_known_cases_and_zero_where_undefined():
    assert matthews_corrcoef([0, 1, 2, 1], [0, 1, 2, 1]) == 1.0
    assert matthews_corrcoef([1, 0, 1, 0], [0, 1, 0, 1]) == -1.0
    assert f1_binary([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(2 / 3) and accuracy([1, 1, 0], [1, 0, 0]) == 2 / 3
    assert spearman([1, 2, 3, 10], [1, 4, 9, 100]) == pytest.approx(1.0)  # monotone, not linear
    assert pearson([1, 2, 3, 10], [1, 4, 9, 100]) < 0.999
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833)  # tied ranks share their mean
    # A run that predicts one class or one score: 0, not nan, so that it ranks below the others; no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert matthews_corrcoef(np.ones(5), [0, 1, 1, 0, 1]) == 0.0 and f1_binary([0, 0], [0, 0]) == 0.0
        assert pearson([2.5] * 4, [0, 1, 2, 3]) == 0.0 and spearman([2.5] * 4, [0, 1, 2, 3]) == 0.0


def test_task_scores_average_as_the_paper():
    mrpc = task_metrics(get_task("MRPC"), {"dev": [1, 1, 0, 0]}, {"dev": [1, 0, 0, 0]})
    assert mrpc["accuracy"] == 0.75 and mrpc["f1"] == pytest.approx(2 / 3)
    assert mrpc["score"] == pytest.approx((0.75 + 2 / 3) / 2)
    mnli = task_metrics(get_task("MNLI"), {"dev_matched": [0, 1, 2, 2], "dev_mismatched": [0, 0]},
                        {"dev_matched": [0, 1, 2, 0], "dev_mismatched": [0, 1]})
    assert (mnli["matched_accuracy"], mnli["mismatched_accuracy"], mnli["score"]) == (0.75, 0.5, 0.625)
    sts = task_metrics(get_task("STS-B"), {"dev": [0.1, 2.0, 2.5, 4.0]}, {"dev": [0.0, 3.0, 2.0, 5.0]})
    assert sts["score"] == pytest.approx((pearson([0.1, 2, 2.5, 4], [0, 3, 2, 5]) + 0.8) / 2)
    assert glue_average(PAPER_SCORES) == pytest.approx(PAPER_AVERAGE, abs=0.05)


# ------------------------------------------------------------------------------------------------
# Protocol
# ------------------------------------------------------------------------------------------------


def test_eval_interval_and_grid():
    assert (eval_interval(100_000), eval_interval(1230), eval_interval(25), eval_interval(3)) == (500, 123, 2, 1)
    specs = grid_specs(["RTE", "sst2"])
    assert len(specs) == 2 * 5 * 6 * 2 and len(set(s.key for s in specs)) == len(specs)
    assert {s.init for s in specs if s.task == "RTE"} == {"mnli"} and {s.init for s in specs if s.task == "SST-2"} == {
        "pretrained"}
    assert {s.learning_rate for s in specs} == set(PAPER_GRID["learning_rate"])
    assert {s.init for s in grid_specs(["RTE"], transfer=False)} == {"pretrained"}
    assert len(grid_specs(["CoLA"], [0, 8], [-1e-5, 1e-5], [1e-2])) == 1  # invalid values are dropped
    with pytest.raises(ValueError, match="no valid point.*batch_sizes=\\[0\\]"):
        grid_specs(["CoLA"], [0], [1e-5], [1e-2])
    preset = {"rte": {"batch_size": 16, "learning_rate": 2e-5, "weight_decay": 1e-2}}
    assert [s.key for s in preset_specs(preset)] == ["RTE_bs16_lr2e-05_wd0.01_seed0_mnli"]
    with pytest.raises(ValueError, match=r"no settings for \['CoLA'\]"):
        preset_specs(preset, ["CoLA"])


def test_not_neobert_folder(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"{tmp_path} is not NeoBERT-compatible: model_type='bert'"):
        load_classifier(tmp_path, get_task("RTE"))
    with pytest.raises(ValueError, match=f"^--model {tmp_path}/nothing: no such folder$"):
        load_classifier(tmp_path / "nothing", get_task("RTE"))


def test_only_unexpected_weights_are_reported_at_load(model_dir, tmp_path, capfd, caplog):
    """transformers' LOAD REPORT table (colour codes and all) listed the new head's weights on every GLUE run and
    watched checkpoint. The head of a pre-trained folder is expected to be new; encoder weights are not."""
    load_classifier(model_dir, get_task("SST-2"))
    assert "LOAD REPORT" not in capfd.readouterr().err and not caplog.records
    shutil.copytree(model_dir, tmp_path / "partial")
    weights = load_file(str(tmp_path / "partial" / "model.safetensors"))
    from safetensors.torch import save_file

    save_file({k: v for k, v in weights.items() if k != "model.layer_norm.weight"},
              str(tmp_path / "partial" / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level("WARNING"):
        load_classifier(tmp_path / "partial", get_task("SST-2"))
    assert "LOAD REPORT" not in capfd.readouterr().err
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}/partial: the classifier's weights do not match the folder's: missing (newly initialised): "
        f"model.layer_norm.weight"]


@pytest.mark.parametrize("task, learning_rate, epochs", [("SST-2", 3e-3, 6), ("STS-B", 1e-2, 12), ("RTE", 3e-3, 6)])
def test_fine_tune_learns(model_dir, glue_dir, task, learning_rate, epochs, tmp_path):
    """Classification, regression and a pair task, end to end from TSV files."""
    spec = RunSpec(task, batch_size=8, learning_rate=learning_rate, weight_decay=1e-2)
    protocol = Protocol(epochs=epochs, patience=100, max_length=32, warmup_ratio=0.0)
    record = fine_tune(model_dir, spec, protocol, data_dir=glue_dir, progress=False, checkpoint_dir=tmp_path / "best")
    assert record["steps"] == epochs * 6 and record["eval_every"] == 1 and len(record["history"]) == epochs * 6
    assert record["score"] == max(h["score"] for h in record["history"])
    # a keyword decides the label: from chance at the first evaluation to (nearly) right
    assert record["history"][0]["score"] < 0.65 < 0.8 < record["score"]
    if task != "STS-B":
        return
    # the saved checkpoint is the best evaluation's model: it reproduces the recorded Pearson/Spearman
    assert set(record["metrics"]) == {"pearson", "spearman", "score"}
    from transformers import AutoTokenizer

    model = load_classifier(tmp_path / "best", get_task("STS-B")).eval()
    dev = load_split(get_task("STS-B"), "dev", glue_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "best"), trust_remote_code=True)
    with torch.no_grad():
        pred = model(**tokenizer(dev.text_a, dev.text_b, padding=True, return_tensors="pt")).logits.squeeze(-1)
    assert pearson(pred.numpy(), dev.labels) == pytest.approx(record["metrics"]["pearson"], abs=1e-5)


def test_early_stopping(model_dir, glue_dir):
    # learning rate 0: every evaluation equals the first, so training stops after exactly 1 + patience
    spec = RunSpec("SST-2", batch_size=2, learning_rate=0.0, weight_decay=0.0)
    protocol = Protocol(epochs=10, patience=3, max_length=32)
    record = fine_tune(model_dir, spec, protocol, data_dir=glue_dir, progress=False)
    assert record["steps_per_epoch"] == 24 and record["eval_every"] == 2
    assert record["stopped_early"] and len(record["history"]) == 4 and record["steps"] == 8
    assert record["best_step"] == 2


def test_mnli_transfer_and_resume(model_dir, glue_dir, tmp_path, monkeypatch):
    out = tmp_path / "glue"
    protocol = Protocol(epochs=2, patience=100, max_length=32)
    specs = grid_specs(["MNLI"], [8], [3e-3, 1e-3], [1e-2]) + grid_specs(["RTE"], [16], [1e-3], [1e-2])
    summary = run_glue(model_dir, out, specs, protocol, data_dir=glue_dir, devices=["cpu"], progress=False)

    mnli = [r for r in summary["runs"] if r["task"] == "MNLI"]
    best = max(mnli, key=lambda r: r["score"])
    assert best_mnli_checkpoint(out) == best["checkpoint"]
    assert [p.name for p in (out / "checkpoints").iterdir()] == [best["key"]]  # the others were pruned
    assert all(r["init_checkpoint"] == best["checkpoint"] for r in summary["runs"] if r["task"] == "RTE")
    assert summary["best"]["MNLI"]["key"] == best["key"] and summary["average"] is None
    table = (out / "results.md").read_text()
    assert "| NeoBERT (paper) | 66.2 | 95.6 | 93.4 | 91.8 | 90.7 | 89.0 | 93.7 | 91.3 | 89.0 |" in table
    assert f"{100 * best['score']:.1f}" in table
    assert json.loads((out / "preset.json").read_text())["MNLI"]["learning_rate"] == best["learning_rate"]

    # The transfer run starts from the saved MNLI weights: encoder and dense layer equal, the 2-way classifier new.
    saved = load_file(f"{best['checkpoint']}/model.safetensors")
    seen = {}

    def load_and_record(*args, **kwargs):  # the weights the run starts from
        model = load_classifier(*args, **kwargs)
        seen.update({k: v.clone() for k, v in model.state_dict().items()})
        return model

    rte = RunSpec("RTE", 8, 1e-3, 1e-2, seed=1, init="mnli")
    with monkeypatch.context() as patch:
        patch.setattr("megatron_neobert.evaluation.glue.load_classifier", load_and_record)
        fine_tune(model_dir, rte, Protocol(epochs=1, max_length=32), data_dir=glue_dir, init_path=best["checkpoint"],
                  progress=False)
    encoder = [k for k in saved if k.startswith("model.")]
    assert len(encoder) > 5 and all(torch.equal(seen[k], saved[k]) for k in encoder + ["dense.weight", "dense.bias"])
    assert saved["classifier.weight"].shape == (3, 32) and seen["classifier.weight"].shape == (2, 32)
    assert not torch.equal(seen["model.encoder.weight"], load_file(f"{model_dir}/model.safetensors")["model.encoder.weight"])

    # Resume: finished runs are not redone, nothing is rewritten.
    before = {p.name: p.stat().st_mtime_ns for p in (out / "runs").iterdir()}
    monkeypatch.setattr("megatron_neobert.evaluation.glue_grid.fine_tune",
                        lambda **kw: pytest.fail(f"re-ran {kw['spec'].key}"))
    run_glue(model_dir, out, specs, protocol, data_dir=glue_dir, devices=["cpu"], progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").iterdir()} == before
    with pytest.raises(ValueError, match="holds results of another model"):
        run_glue(glue_dir, out, specs, protocol, data_dir=glue_dir, devices=["cpu"], progress=False)
    with pytest.raises(ValueError, match=r"\['RTE'\] start from the best MNLI checkpoint"):
        run_glue(model_dir, tmp_path / "empty", grid_specs(["RTE"], [8], [1e-3], [0.0]), protocol,
                 data_dir=glue_dir, devices=["cpu"], progress=False)


@pytest.mark.integration
def test_cli_with_process_pool(model_dir, glue_dir, tmp_path, monkeypatch):
    """Two CPU 'devices': runs go to two spawned workers, each run's record lands in runs/."""
    from tools.run_glue import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # read by the spawned workers' torch

    out = tmp_path / "cli"
    main(["--model", str(model_dir), "--output_dir", str(out), "--data_dir", str(glue_dir), "--tasks", "CoLA",
          "--batch_sizes", "16", "--learning_rates", "1e-3", "3e-3", "--weight_decays", "0.01", "--epochs", "1",
          "--max_length", "32", "--devices", "cpu", "cpu", "--no_progress"])
    records = glue_grid.load_records(out)
    assert sorted(r["learning_rate"] for r in records) == [1e-3, 3e-3]
    assert all(r["task"] == "CoLA" and "matthews" in r["metrics"] for r in records)
    assert "| ours | " in (out / "results.md").read_text()


@pytest.mark.integration
def test_cli_output_to_a_log_is_plain_lines(model_dir, glue_dir, tmp_path):
    """To a pipe (as to a log file), the nested bars (grid, then steps of a run) become plain lines: no carriage
    returns or cursor moves, and no "Loading weights" bar of transformers. (transformers' report of the new
    classifier weights is bold whatever the output: its codes are not looked for.)"""
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "tools/run_glue.py", "--model", str(model_dir), "--output-dir",
                          str(tmp_path / "glue"), "--data-dir", str(glue_dir), "--tasks", "CoLA", "--batch-sizes", "16",
                          "--learning-rates", "1e-3", "--weight-decays", "0", "--epochs", "1", "--max-length", "32",
                          "--devices", "cpu"], cwd=repo, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo)] + sys.path)), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    logged = out.stdout + out.stderr
    assert out.stderr.count("GLUE runs: 1/1") == 1, logged
    assert "CoLA_bs16_lr0.001_wd0_seed0_pretrained: 3/3" in out.stderr, logged
    assert "\r" not in logged and "\x1b[A" not in logged and "Loading weights" not in logged


def test_results_of_other_settings_are_not_reused(model_dir, glue_dir, tmp_path):
    """A finished run counts only with the same protocol and data: another --epochs, --max-length or data folder
    is refused by name, not reported with the old scores."""
    out = tmp_path / "glue"
    specs = grid_specs(["SST-2"], [16], [1e-3], [0.0])
    protocol = Protocol(epochs=1, max_length=32)
    run_glue(model_dir, out, specs, protocol, data_dir=glue_dir, devices=["cpu"], progress=False)
    other_data = tmp_path / "glue_copy"
    shutil.copytree(glue_dir, other_data)
    for changed, message in [(dict(protocol=Protocol(epochs=2, max_length=32)), r"epochs=1 \(now 2\)"),
                             (dict(protocol=Protocol(epochs=1, max_length=64)), r"max_length=32 \(now 64\)"),
                             (dict(data_dir=other_data), "data=.*glue.* \\(now .*glue_copy'\\)")]:
        kwargs = dict(dict(protocol=protocol, data_dir=glue_dir), **changed)
        with pytest.raises(ValueError, match="holds run SST-2_bs16_lr0.001_wd0_seed0_pretrained made with other "
                                             "settings: " + message):
            run_glue(model_dir, out, specs, kwargs["protocol"], data_dir=kwargs["data_dir"], devices=["cpu"],
                     progress=False)
    assert len(glue_grid.load_records(out)) == 1


def test_a_folder_exported_again_with_other_weights_is_run_again(glue_dir, tmp_path):
    """Finished runs are keyed by the hash of the folder's weights and tokenizer, not by its path: the old runs
    move to superseded/ and the grid runs again."""
    from tools.run_glue import main

    folder = make_neobert_folder(tmp_path / "hf2", seed=0, num_hidden_layers=1)
    tokenizer = tmp_path / ".hf2-tokenizer"
    argv = ["--model", str(folder), "--output-dir", str(tmp_path / "out"), "--data-dir", str(glue_dir), "--tasks",
            "SST-2", "--batch-sizes", "16", "--learning-rates", "1e-3", "--weight-decays", "0", "--epochs", "1",
            "--max-length", "32", "--devices", "cpu", "--no-progress"]
    first = main(argv)["runs"][0]
    config = tiny_config(num_hidden_layers=1)
    write_hf_folder(folder, random_mlm_state_dict(config, seed=1), config, tokenizer_path=tokenizer, overwrite=True)
    second = main(argv)["runs"]
    assert len(second) == 1 and second[0]["model_revision"] != first["model_revision"]
    assert second[0]["history"] != first["history"]
    assert json.loads((tmp_path / "out" / "superseded" / first["model_revision"] / "runs" /
                       f"{first['key']}.json").read_text()) == first
    assert main(argv)["runs"] == second  # the same weights again: reused


@pytest.mark.integration
def test_other_settings_in_the_output_dir_end_the_tool_in_one_line(model_dir, glue_dir, tmp_path):
    out = tmp_path / "out"
    run_glue(model_dir, out, grid_specs(["SST-2"], [16], [1e-3], [0.0]), Protocol(epochs=1, max_length=32),
             data_dir=glue_dir, devices=["cpu"], progress=False)
    tool = subprocess.run(
        [sys.executable, "tools/run_glue.py", "--model", str(model_dir), "--output-dir", str(out), "--data-dir",
         str(glue_dir), "--tasks", "SST-2", "--batch-sizes", "16", "--learning-rates", "1e-3", "--weight-decays", "0",
         "--epochs", "2", "--max-length", "32", "--devices", "cpu", "--no-progress"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    errors = [line for line in tool.stderr.splitlines() if line.startswith("error:")]
    assert tool.returncode == 1 and "Traceback" not in tool.stderr, tool.stderr
    assert errors == [f"error: {out} holds run SST-2_bs16_lr0.001_wd0_seed0_pretrained made with other settings: "
                      f"epochs=1 (now 2); use a separate output_dir for these settings (or the same settings to "
                      f"resume)"], tool.stderr


def test_missing_mnli_transfer_source_fails_before_any_run(model_dir, glue_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("megatron_neobert.evaluation.glue_grid.fine_tune",
                        lambda **kw: pytest.fail(f"ran {kw['spec'].key} before checking the transfer"))
    from tools.run_glue import main

    with pytest.raises(SystemExit, match=r"^error: \['RTE'\] start from the best MNLI checkpoint.*--no-transfer"):
        main(["--model", str(model_dir), "--output-dir", str(tmp_path / "out"), "--data-dir", str(glue_dir),
              "--tasks", "CoLA", "RTE", "--batch-sizes", "16", "--learning-rates", "1e-3", "--weight-decays", "0",
              "--no-progress"])
    assert not (tmp_path / "out").exists()


def test_missing_task_files_fail_before_any_run(model_dir, glue_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("megatron_neobert.evaluation.glue_grid.fine_tune",
                        lambda **kw: pytest.fail(f"ran {kw['spec'].key} before checking the files"))
    with pytest.raises(FileNotFoundError, match=r"lacks 4 GLUE file\(s\): .*MRPC/train.tsv, .*MRPC/dev.tsv, "
                                                r".*QNLI/train.tsv, .*QNLI/dev.tsv \(docs/glue.md"):
        run_glue(model_dir, tmp_path / "out", grid_specs(["CoLA", "QNLI", "MRPC"], [16], [1e-3], [0.0], transfer=False),
                 Protocol(), data_dir=glue_dir, devices=["cpu"], progress=False)
