"""Watch a pre-training run: every checkpoint evaluated downstream as it lands (docs/watch.md).

A run's `--save` folder is polled. An iteration folder is taken once the trainer's marker has reached it (the
marker moves only after the folder and its `checksums.json` are complete) and its files match the manifest;
it is exported to a temporary Hugging Face folder with the run's tokenizer, the suite's tasks run on it, and
the scores go to the run's TensorBoard folder (an event file of our own, beside the trainer's), to
`downstream.jsonl` and to `downstream.png` (every score against tokens seen).

Nothing is written into the iteration folders or the marker (results default to {root}/downstream). A result
is keyed by the exported weights' hash and the settings of its task group, so a restarted watcher skips what
is done and a rewritten checkpoint is evaluated again; the manifest's hash stands for the weights before an
export, so a restart does not export checkpoints it has already evaluated.
"""

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from megatron_neobert.atomic_write import atomic_path
from megatron_neobert.extras import require_extra
from megatron_neobert.model_source import folder_listing
from megatron_neobert.checkpoint.layout import (LATEST_MARKER, complete_iterations, iteration_dir,
                                                         saved_iterations)
from megatron_neobert.checkpoint.lock import LOCK_NAME

RESULTS = "downstream.jsonl"
PLOT = "downstream.png"
EVENT_SUFFIX = ".downstream"  # our own event file: the trainer's are never opened for writing

# --------------------------------------------------------------------------------------------------------
# Task groups: an exported folder in, (task, metric, value) rows out
# --------------------------------------------------------------------------------------------------------


def run_pseudo_perplexity(hf_dir: Path, s: dict, device: str, workdir: Path) -> List[Tuple[str, str, float]]:
    from transformers import AutoTokenizer

    from .pseudo_perplexity import DEFAULT_BUCKETS, bucket_results, load_mlm, load_texts, pseudo_perplexities

    model = load_mlm(hf_dir, None, device)
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=True)
    texts = load_texts(s["texts"], s["text_field"], limit=s["num_texts"])
    results = pseudo_perplexities(model, tokenizer, texts, s["max_length"], s["batch_size"], s["min_length"],
                                  progress=False)
    if not results:
        raise ValueError(f"no text of {s['texts']} has at least {s['min_length']} tokens")
    # As neobert-pseudo-perplexity: the buckets cut at the length cap, which is always an edge.
    edges = sorted({e for e in (s["buckets"] or DEFAULT_BUCKETS) if e < s["max_length"]} | {s["max_length"]})
    return [(f"pppl/len_{b['max_length']}", "pseudo_perplexity", b["pseudo_perplexity"])
            for b in bucket_results(results, edges)]


def run_glue(hf_dir: Path, s: dict, device: str, workdir: Path) -> List[Tuple[str, str, float]]:
    from .glue import fine_tune
    from .glue_data import get_task
    from .glue_protocol import Protocol, RunSpec

    protocol = Protocol(epochs=s["epochs"], max_length=s["max_length"], max_train_examples=s["max_train_examples"])
    rows = []
    for name in s["tasks"]:
        task = get_task(name)
        spec = RunSpec(task.name, s["batch_size"], s["learning_rate"], s["weight_decay"], s["seed"])
        record = fine_tune(hf_dir, spec, protocol, data_dir=s["data_dir"], device=device, progress=False)
        # x100, as the paper's table (and MTEB's main scores below)
        rows.append((f"glue/{task.name.lower().replace('-', '')}", "score", 100 * record["score"]))
    return rows


def run_mteb(hf_dir: Path, s: dict, device: str, workdir: Path) -> List[Tuple[str, str, float]]:
    from megatron_neobert.embeddings import mteb_eval
    from megatron_neobert.embeddings.mteb_local import local_task

    tasks = [local_task(folder) for folder in s["tasks"]]
    model = mteb_eval.NeoBERTEncoder(hf_dir, dtype=s["dtype"], device=device, batch_size=s["batch_size"],
                                     max_length=s["max_length"], use_instructions=s["instructions"])
    summary = mteb_eval.run_mteb(model, tasks, workdir / "mteb", encode_batch_size=s["batch_size"])
    return [(f"mteb/{name}", "main_score", v["main_score"]) for name, v in sorted(summary["tasks"].items())]


@dataclass(frozen=True)
class TaskGroup:
    """What a suite's task group is: the function that scores an exported folder with the group's settings, the
    settings a suite must give, the others with their defaults, those that name files (relative to the suite
    file's folder), and the eval extra's modules it imports (checked when the suite is read)."""

    run: Callable[[Path, dict, str, Path], List[Tuple[str, str, float]]]
    required: Tuple[str, ...]
    defaults: Dict[str, object]
    paths: Tuple[str, ...]
    needs: Tuple[str, ...] = ()

    @property
    def settings(self) -> Tuple[str, ...]:
        return (*self.required, *self.defaults)


TASK_GROUPS: Dict[str, TaskGroup] = {
    "pseudo_perplexity": TaskGroup(
        run_pseudo_perplexity, required=("texts",), paths=("texts",),
        defaults=dict(text_field="text", num_texts=None, max_length=512, min_length=2, buckets=None, batch_size=32)),
    "glue": TaskGroup(
        run_glue, required=("data_dir", "tasks"), paths=("data_dir",), needs=("scipy", "sklearn"),
        defaults=dict(max_train_examples=256, epochs=1, batch_size=16, learning_rate=1e-4, weight_decay=0.01,
                      max_length=128, seed=0)),
    "mteb": TaskGroup(
        run_mteb, required=("tasks",), paths=("tasks",), needs=("mteb", "datasets"),
        defaults=dict(dtype="float32", batch_size=32, max_length=None, instructions=True)),
}


# --------------------------------------------------------------------------------------------------------
# The suite
# --------------------------------------------------------------------------------------------------------


def load_suite(path) -> Dict[str, dict]:
    """{group: settings} from a YAML suite file; unknown groups or settings and missing required ones are
    errors naming them."""
    import yaml

    path = Path(path)
    with open(path, encoding="utf-8") as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"suite {path}: expected a mapping of task groups ({', '.join(TASK_GROUPS)})")
    suite = {}
    for group, given in raw.items():
        if group not in TASK_GROUPS:
            raise ValueError(f"suite {path}: unknown task group {group!r} (known: {', '.join(TASK_GROUPS)})")
        task_group, given = TASK_GROUPS[group], given or {}
        if task_group.needs:
            require_extra("eval", f"suite {path}: {group}", task_group.needs)
        unknown = sorted(set(given) - set(task_group.settings))
        if unknown:
            raise ValueError(f"suite {path}: {group} has unknown settings {unknown} "
                             f"(known: {sorted(task_group.settings)})")
        settings = {**task_group.defaults, **given}
        missing = [k for k in task_group.required if settings.get(k) is None]
        if missing:
            raise ValueError(f"suite {path}: {group} needs {', '.join(missing)}")
        for name in task_group.paths:
            value = settings[name]
            resolve = lambda p: str((path.parent / p).resolve())  # noqa: E731
            settings[name] = [resolve(p) for p in value] if isinstance(value, list) else resolve(value)
        suite[group] = settings
    return suite


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------------------
# downstream.jsonl: whole lines appended and synced; a partial last line (a watcher killed mid-write) is
# ignored on read and cut off before the next append
# --------------------------------------------------------------------------------------------------------


def read_rows(path) -> List[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    return [json.loads(line) for line in lines[:-1] if line.strip()]


def append_rows(path, rows: List[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(0)
            whole = f.read().rfind(b"\n") + 1
            if whole != size:
                f.truncate(whole)
        f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())
        f.flush()
        os.fsync(f.fileno())


# --------------------------------------------------------------------------------------------------------
# The plot
# --------------------------------------------------------------------------------------------------------


def plot_scores(rows_by_run: Dict[str, List[dict]], path) -> Path:
    """One panel per task, each run a line of its scores against tokens seen. The PNG's Description names
    the runs and their points per task, readable without viewing the image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for rows in rows_by_run.values() for r in rows})
    cols = min(3, max(1, len(tasks)))
    n_rows = max(1, -(-len(tasks) // cols))
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.5 * cols, 3.2 * n_rows), squeeze=False)
    points = {}
    for ax, task in zip(axes.flat, tasks):
        for label, rows in rows_by_run.items():
            series = sorted((r["tokens"], r["value"]) for r in rows if r["task"] == task)
            if series:
                ax.plot([t for t, _ in series], [v for _, v in series], "o-", label=label)
                points.setdefault(label, {})[task] = len(series)
        ax.set_title(task)
        ax.set_xlabel("tokens seen")
        ax.set_ylabel(next(r["metric"] for rows in rows_by_run.values() for r in rows if r["task"] == task))
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:  # a dashboard never reads half a PNG
        fig.savefig(tmp, dpi=100, metadata={"Description": json.dumps(points, sort_keys=True)})
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------
# A run
# --------------------------------------------------------------------------------------------------------


def check_run_folder(root: str, once: bool) -> Optional[str]:
    """None when `root` holds the trainer's checkpoints. A folder that cannot become a run's --save (missing, a
    file, a Hugging Face folder, other files) is a ValueError saying what it found, and so is one with nothing
    saved yet when `once` asks for what is there; without `once`, a run's folder before its first save (empty,
    or the trainer's writer.lock alone) returns the line to say while waiting for it."""
    if not os.path.exists(root):
        raise ValueError(f"{root} does not exist: give the run's --save folder (the trainer makes it as it starts)")
    if not os.path.isdir(root):
        raise ValueError(f"{root} is a file, not a run's --save folder")
    if os.path.isfile(os.path.join(root, LATEST_MARKER)) or saved_iterations(root):
        return None
    layout = f"no {LATEST_MARKER}, no iter_NNNNNNN folder"
    if os.path.isfile(os.path.join(root, "config.json")):
        raise ValueError(f"{root} is a Hugging Face model folder ({folder_listing(root)}), not a run's --save "
                         f"folder ({layout}): the watcher exports each checkpoint itself; give the trainer's --save")
    started = set(os.listdir(root)) <= {LOCK_NAME, "downstream"}  # the trainer's lock, the watcher's results
    if started and not once:
        return f"{root}: no checkpoint yet ({layout}): waiting for the run's first save"
    runs = sorted(os.path.join(root, n) for n in os.listdir(root)
                  if os.path.isfile(os.path.join(root, n, LATEST_MARKER)))
    advice = ("nothing to evaluate with --once" if started
              else f"did you mean {runs[0]}?" if runs else "give the run's --save folder")
    raise ValueError(f"{root} holds no trainer checkpoint ({layout}; it holds: {folder_listing(root)}): {advice}")


def export_checkpoint(folder: str, dst: Path, tokenizer: Optional[str]) -> None:
    from megatron_neobert.conversion.convert import mcore_to_hf

    mcore_to_hf(folder, dst, tokenizer=tokenizer, progress=False)


@dataclass
class Run:
    """One watched run: its checkpoint root, where its results go, and what this session has seen."""

    root: str
    suite: Dict[str, dict]
    device: str
    output: Optional[str] = None  # default {root}/downstream
    tensorboard_dir: Optional[str] = None  # default: the run's --tensorboard-dir, else `output`
    tokenizer: Optional[str] = None  # default: the run's own
    log: Callable[[str], None] = lambda line: print(line, flush=True)  # a watcher's log is often piped
    seen: set = field(default_factory=set)  # iterations taken (or skipped) by this session
    train_iters: Optional[int] = None
    writer: object = None

    def __post_init__(self):
        self.output = self.output or os.path.join(self.root, "downstream")
        # The device's kind decides numerics (bf16 autocast on GPUs), so it is part of the settings.
        self.settings = {g: {**s, "device": self.device.split(":")[0]} for g, s in self.suite.items()}
        self.hashes = {g: settings_hash(s) for g, s in self.settings.items()}

    @property
    def results(self) -> Path:
        return Path(self.output) / RESULTS

    @property
    def finished(self) -> bool:
        """The checkpoint of the run's last iteration has been taken."""
        return self.train_iters is not None and self.train_iters in self.seen

    def _done(self, key: str, value: str) -> set:
        """Groups whose rows are all in the results for `key` ("weights" or "checkpoint") = value."""
        rows = [r for r in read_rows(self.results)
                if r[key] == value and r["settings_hash"] == self.hashes.get(r["group"])]
        return {g for g in self.hashes if (n := [r for r in rows if r["group"] == g]) and len(n) == n[0]["of"]}

    def poll(self) -> int:
        """Evaluate every complete checkpoint not taken yet; returns how many got new scores."""
        evaluated = 0
        for it in complete_iterations(self.root):
            if it not in self.seen:
                evaluated += self.take(it)
                self.seen.add(it)
        if evaluated:
            plot_scores({self.root: read_rows(self.results)}, Path(self.output) / PLOT)
        return evaluated

    def take(self, iteration: int) -> bool:
        from torch.distributed.checkpoint import CheckpointException

        from megatron_neobert.conversion.convert import read_checkpoint_args
        from megatron_neobert.conversion.hf_format import checkpoint_revision
        from megatron_neobert.checkpoint.integrity import MANIFEST, folder_problem

        folder = iteration_dir(self.root, iteration)

        def pruned() -> bool:
            if os.path.isfile(os.path.join(folder, "metadata.json")) and os.path.isfile(os.path.join(folder, MANIFEST)):
                return False
            self.log(f"iteration {iteration}: pruned by the run (--keep-last-n-checkpoints) before or while it "
                     f"was read: skipped")
            return True

        try:
            with open(os.path.join(folder, MANIFEST), "rb") as f:
                checkpoint = hashlib.sha256(f.read()).hexdigest()[:16]
        except FileNotFoundError:
            if not pruned():
                self.log(f"iteration {iteration}: no {MANIFEST} (saved by a converter?): its files cannot be "
                         f"verified, skipped")
            return False
        if self._done("checkpoint", checkpoint) == set(self.hashes):
            # Evaluated by an earlier session: not even exported again.
            self.train_iters = next(r["train_iters"] for r in read_rows(self.results)
                                    if r["checkpoint"] == checkpoint)
            self.log(f"iteration {iteration}: evaluated before (in {self.results}): skipped")
            return False
        self._init_process_group()
        workdir = Path(tempfile.mkdtemp(prefix=f"watch-iter{iteration}-"))
        try:
            try:
                problem = folder_problem(folder)
                if problem:
                    if not pruned():
                        self.log(f"iteration {iteration}: {problem}: skipped")
                    return False
                _, args = read_checkpoint_args(folder)
                started = time.time()
                export_checkpoint(folder, workdir / "hf", self.tokenizer)
            except (Exception, CheckpointException):  # megatron-core raises a reader's failure as a BaseException
                if pruned():
                    return False
                raise
            weights = checkpoint_revision(workdir / "hf")
            self.log(f"iteration {iteration}: exported in {time.time() - started:.1f} s (weights {weights})")
            self.train_iters = args.get("train_iters")
            todo = [g for g in self.settings if g not in self._done("weights", weights)]
            if not todo:
                self.log(f"iteration {iteration}: weights {weights} already evaluated: skipped")
            for group in todo:
                self._evaluate(group, iteration, args, checkpoint, weights, workdir)
            if todo:
                self.log(f"iteration {iteration}: scored in {time.time() - started:.1f} s (export included)")
            return bool(todo)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _evaluate(self, group: str, iteration: int, args: dict, checkpoint: str, weights: str, workdir: Path):
        started = time.time()
        scores = TASK_GROUPS[group].run(workdir / "hf", self.suite[group], self.device, workdir)
        seconds = round(time.time() - started, 1)
        samples = args.get("consumed_train_samples")
        tokens = samples * args["seq_length"]  # sequence positions read, padding included, as Megatron counts
        rows = [dict(run=str(Path(self.root).resolve()), iteration=iteration, consumed_samples=samples,
                     tokens=tokens, train_iters=args.get("train_iters"), checkpoint=checkpoint, weights=weights,
                     group=group, task=task, metric=metric, value=value, of=len(scores),
                     settings=self.settings[group], settings_hash=self.hashes[group], seconds=seconds,
                     evaluated_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
                for task, metric, value in scores]
        # TensorBoard first: a watcher killed between the two evaluates the group again on restart, instead of
        # leaving scores in downstream.jsonl that the dashboard never shows.
        writer = self._writer(args)
        for r in rows:
            writer.add_scalar(f"downstream/{r['task']}", r["value"], iteration)
            writer.add_scalar(f"downstream/{r['task']} vs tokens", r["value"], tokens)
        writer.flush()
        append_rows(self.results, rows)
        self.log(f"iteration {iteration} ({tokens:,} tokens): {group} in {seconds:.1f} s: "
                 + ", ".join(f"{r['task']} {r['value']:.4g}" for r in rows))

    def _writer(self, args: dict):
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            folder = self.tensorboard_dir or args.get("tensorboard_dir") or self.output
            self.writer = SummaryWriter(folder, filename_suffix=EVENT_SUFFIX)
            self.log(f"{self.root}: scores go to TensorBoard in {folder}, and to {self.results}")
        return self.writer

    @staticmethod
    def _init_process_group():
        """The checksum check and the export run as one rank of their own (never torchrun's)."""
        from megatron_neobert.parallel.launch import init_distributed

        init_distributed()

    def close(self):
        if self.writer is not None:
            self.writer.close()


def watch(runs: Iterable[Run], once: bool = False, interval: float = 60.0, compare_plot=None) -> None:
    """Poll the runs until each has had its last iteration evaluated (or once, with `once`); with
    `compare_plot`, every run's scores in one PNG there after each poll that added any."""
    runs = list(runs)
    try:
        while True:
            new = sum(run.poll() for run in runs)
            if compare_plot and (new or not Path(compare_plot).exists()):
                plot_scores({r.root: read_rows(r.results) for r in runs}, compare_plot)
            if once or all(r.finished for r in runs):
                return
            time.sleep(interval)
    finally:
        for run in runs:
            run.close()
