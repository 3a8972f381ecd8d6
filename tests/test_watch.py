"""tools/watch_run.py beside a training run: every saved checkpoint scored once per task, in TensorBoard and
downstream.jsonl; a restart after a kill mid-write evaluates nothing twice; a checkpoint pruned while it is
read is skipped; several runs in one plot.

The run's steps share one test, since each needs the same trained run (a module fixture would train once per
xdist worker)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from embed_fixtures import load_tool
from pretrain_cases import tiny_argv

from megatron_neobert.data.assets import SAMPLE_CORPUS

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = [2, 4, 6]
TASKS = ["glue/sst2", "mteb/MySTS", "pppl/len_64"]
TOKENS_PER_ITERATION = 8 * 64  # global batch x sequence length of tiny_argv


def write_suite(root: Path, groups=("pseudo_perplexity", "glue", "mteb")) -> Path:
    """GLUE SST-2 TSVs, a local MTEB STS task and a suite naming them, with pseudo-perplexity on 3 sample
    documents cut to 64 tokens (one bucket)."""
    rows = [("the movie was good", 1), ("a bad film", 0), ("good acting", 1), ("bad plot", 0)] * 8
    (root / "glue" / "SST-2").mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev"):
        (root / "glue" / "SST-2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in rows))
    (root / "tasks" / "MySTS").mkdir(parents=True, exist_ok=True)
    pairs = [("a cat", "a small cat", 4.5), ("a dog", "a river", 0.5), ("birds fly", "a bird flies", 4.0),
             ("fish swim", "a city road", 0.0)]
    (root / "tasks" / "MySTS" / "test.jsonl").write_text(
        "".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in pairs))
    sections = {"pseudo_perplexity": f"pseudo_perplexity:\n  texts: {SAMPLE_CORPUS}\n  text_field: content\n"
                                     f"  num_texts: 3\n  max_length: 64\n  buckets: [32]\n",
                "glue": "glue:\n  data_dir: glue\n  tasks: [SST-2]\n  max_train_examples: 32\n  max_length: 16\n",
                "mteb": "mteb:\n  tasks: [tasks/MySTS]\n"}
    suite = root / f"suite-{len(groups)}.yaml"
    suite.write_text("".join(sections[g] for g in groups))
    return suite


def scalars(tb: Path) -> dict:
    """tag -> [(step, value)] of the downstream scalars in a TensorBoard folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
            if tag.startswith("downstream/")}


@pytest.mark.integration
def test_watch_a_run_while_it_trains_then_restart_prune_and_compare(data, tmp_path, monkeypatch):
    suite = write_suite(tmp_path)
    save, tb = tmp_path / "run" / "ckpt", tmp_path / "run" / "tb"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("RANK", None)
    train = subprocess.Popen(
        [sys.executable, "-m", "megatron_neobert.pretrain",
         *tiny_argv(*data, "--train-iters", "6", "--save", str(save), "--save-interval", "2",
                    "--tensorboard-dir", str(tb))],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Started once the trainer has made its --save folder (a missing one is refused), before any checkpoint: it
    # follows the run and exits once the last is scored.
    deadline = time.monotonic() + 300
    while not save.is_dir() and train.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    watcher = subprocess.Popen([sys.executable, str(REPO / "tools" / "watch_run.py"), "--save", str(save),
                                "--suite", str(suite), "--interval", "1"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    train_log = train.communicate(timeout=600)[0]
    assert train.returncode == 0, train_log[-3000:]
    watch_log = watcher.communicate(timeout=600)[0]
    assert watcher.returncode == 0, watch_log[-3000:]
    assert "LOAD REPORT" not in watch_log  # transformers' table of the GLUE head's new weights, expected

    # One row per checkpoint and task, in downstream.jsonl and in TensorBoard, against iteration and tokens.
    results = save / "downstream" / "downstream.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted((r["iteration"], r["task"]) for r in rows) == [(i, t) for i in ITERATIONS for t in TASKS]
    assert {r["tokens"] for r in rows} == {i * TOKENS_PER_ITERATION for i in ITERATIONS}
    assert len({r["weights"] for r in rows}) == len(ITERATIONS)
    events = scalars(tb)
    assert sorted(events) == sorted([f"downstream/{t}" for t in TASKS] + [f"downstream/{t} vs tokens" for t in TASKS])
    for r in rows:
        assert (r["iteration"], pytest.approx(r["value"])) in events[f"downstream/{r['task']}"]
        assert (r["tokens"], pytest.approx(r["value"])) in events[f"downstream/{r['task']} vs tokens"]
    assert all(len(points) == len(ITERATIONS) for points in events.values())
    # Our own event file beside the trainer's, and nothing written into the checkpoint root but our folder (beside
    # the trainer's checkpoints and its final goodput account).
    assert len([p for p in tb.iterdir() if p.name.endswith(".downstream")]) == 1
    assert sorted(p.name for p in save.iterdir()) == ["downstream", "goodput.json", "iter_0000002", "iter_0000004",
                                                      "iter_0000006", "latest_checkpointed_iteration.txt"]
    assert (save / "downstream" / "downstream.png").stat().st_size > 10_000

    # Killed while appending its last line: the restart ignores the half line, evaluates that group alone again
    # and nothing else.
    text = results.read_text()
    last = text.splitlines()[-1]
    results.write_text(text[: len(text) - len(last) // 2 - 1])
    again = subprocess.run([sys.executable, str(REPO / "tools" / "watch_run.py"), "--save", str(save),
                            "--suite", str(suite), "--once"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    redone = json.loads(last)
    assert "iteration 2: evaluated before" in again.stdout and "iteration 4: evaluated before" in again.stdout
    assert again.stdout.count(": exported in") == 1
    assert f"iteration 6 ({redone['tokens']:,} tokens): {redone['group']} in" in again.stdout
    assert sorted((r["iteration"], r["task"]) for r in map(json.loads, results.read_text().splitlines())) == \
        [(i, t) for i in ITERATIONS for t in TASKS]
    again = subprocess.run([sys.executable, str(REPO / "tools" / "watch_run.py"), "--save", str(save),
                            "--suite", str(suite), "--once"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("evaluated before") == 3 and "exported" not in again.stdout

    # The run pruned iteration 4 (--keep-last-n-checkpoints) while the watcher read it: skipped with a line.
    from megatron_neobert.evaluation import watch

    pruned = tmp_path / "pruned" / "ckpt"
    shutil.copytree(save, pruned, ignore=shutil.ignore_patterns("downstream"))
    export = watch.export_checkpoint

    def export_while_pruned(folder, dst, tokenizer):
        if folder.endswith("iter_0000004"):
            shutil.rmtree(folder)
        export(folder, dst, tokenizer)

    monkeypatch.setattr(watch, "export_checkpoint", export_while_pruned)
    lines = []
    pppl_only = write_suite(tmp_path, ("pseudo_perplexity",))
    watch.watch([watch.Run(str(pruned), watch.load_suite(pppl_only), "cpu",
                           tensorboard_dir=str(tmp_path / "pruned" / "tb"), log=lines.append)], once=True)
    assert "iteration 4: pruned by the run (--keep-last-n-checkpoints) before or while it was read: skipped" in lines
    assert [(r["iteration"], r["task"]) for r in watch.read_rows(pruned / "downstream" / "downstream.jsonl")] == \
        [(2, "pppl/len_64"), (6, "pppl/len_64")]

    # Both runs in one plot: every point of each, and an image with something drawn in it. The suite's one
    # group is done for both, so nothing is evaluated: the plot reads every score of each run's results.
    from PIL import Image

    plot = tmp_path / "ladder.png"
    assert load_tool("watch_run").main(["--compare", str(save), str(pruned), "--suite", str(pppl_only), "--once",
                                        "--plot", str(plot)]) == 0
    image = Image.open(plot)
    assert json.loads(image.info["Description"]) == {str(save): {t: 3 for t in TASKS},
                                                     str(pruned): {"pppl/len_64": 2}}
    assert len(image.convert("RGB").getcolors(1 << 16)) > 50


def test_results_keep_whole_lines_only(tmp_path):
    from megatron_neobert.evaluation.watch import append_rows, read_rows

    results = tmp_path / "downstream.jsonl"
    append_rows(results, [{"task": "a"}, {"task": "b"}])
    with open(results, "a") as f:  # a watcher killed mid-line
        f.write('{"task": "c", "val')
    assert read_rows(results) == [{"task": "a"}, {"task": "b"}]
    append_rows(results, [{"task": "d"}])
    assert read_rows(results) == [{"task": "a"}, {"task": "b"}, {"task": "d"}]
    assert results.read_text().endswith('{"task": "d"}\n')


def test_suite_errors_name_what_is_wrong(tmp_path):
    from megatron_neobert.evaluation.watch import load_suite

    suite = tmp_path / "suite.yaml"
    for text, error in [("squad:\n  tasks: [x]\n", "unknown task group 'squad'"),
                        ("glue:\n  tasks: [SST-2]\n", "glue needs data_dir"),
                        ("mteb:\n  tasks: [t]\n  epochs: 3\n", "mteb has unknown settings ['epochs']"),
                        ("", "expected a mapping of task groups")]:
        suite.write_text(text)
        with pytest.raises(ValueError, match=re.escape(error)):
            load_suite(suite)
    suite.write_text("pseudo_perplexity:\n  texts: docs.jsonl\n  max_length: 64\n")
    assert load_suite(suite) == {"pseudo_perplexity": dict(
        texts=str(tmp_path / "docs.jsonl"), text_field="text", num_texts=None, max_length=64, min_length=2,
        buckets=None, batch_size=32)}


def test_every_task_group_is_complete():
    """Each group's record declares exactly the settings its function reads (a setting read but not declared would
    be a KeyError in the first evaluation, hours into a run; one declared but not read, a setting that does
    nothing); its file settings are among them, and none is both required and defaulted."""
    import inspect

    from megatron_neobert.evaluation.watch import TASK_GROUPS

    assert sorted(TASK_GROUPS) == ["glue", "mteb", "pseudo_perplexity"]
    for name, group in TASK_GROUPS.items():
        read = set(re.findall(r"\bs\[[\"'](\w+)[\"']\]", inspect.getsource(group.run)))
        assert read == set(group.settings), name
        assert set(group.paths) <= set(group.settings), name
        assert not set(group.required) & set(group.defaults), name


def test_a_folder_without_checkpoints_is_refused_or_waited_for(tmp_path):
    """A run's --save before its first save is waited for, with a line (before: silently); with --once, or a
    folder that cannot become a run's --save, it is an error saying what is there."""
    from megatron_neobert.evaluation.watch import check_run_folder

    run = tmp_path / "run"
    run.mkdir()
    (run / "writer.lock").write_text("{}")
    layout = "no latest_checkpointed_iteration.txt, no iter_NNNNNNN folder"
    assert check_run_folder(str(run), once=False) == \
        f"{run}: no checkpoint yet ({layout}): waiting for the run's first save"
    with pytest.raises(ValueError, match=re.escape("it holds: writer.lock): nothing to evaluate with --once")):
        check_run_folder(str(run), once=True)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path} holds no trainer checkpoint ({layout}; it holds: run): "
                                                   f"give the run's --save folder")):
        check_run_folder(str(tmp_path), once=False)
    (run / "iter_0000002").mkdir()
    (run / "latest_checkpointed_iteration.txt").write_text("2")
    assert check_run_folder(str(run), once=True) is None
    with pytest.raises(ValueError, match=re.escape(f"it holds: run): did you mean {run}?")):
        check_run_folder(str(tmp_path), once=True)
