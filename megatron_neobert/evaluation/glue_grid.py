"""GLUE grids: many independent fine-tuning runs, resumable, one per device, then a report.

Layout of `output_dir`:
    runs/{key}.json          one finished run (written atomically; never rewritten)
    checkpoints/{key}/       best weights of each MNLI run (the transfer source of RTE, STS-B, MRPC, QNLI)
    results.json, results.md every run, the best run per task, the average, beside the paper's scores
    preset.json              the best (batch size, learning rate, weight decay) per task, for `--preset`
    superseded/{revision}/   runs/ and checkpoints/ of an earlier content of the model folder (other weights or
                             tokenizer, see `set_aside_other_revisions`)
"""

import json
import logging
import multiprocessing as mp
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from itertools import product
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import torch

from megatron_neobert.atomic_write import write_json_atomic, write_text_atomic
from megatron_neobert.conversion.hf_format import checkpoint_revision, load_neobert_auto_config
from megatron_neobert.model_source import check_model_source
from megatron_neobert.progress import progress_bar

from .glue import fine_tune
from .glue_data import HF_DATASET, TASKS, check_tsv_files, get_task
from .glue_metrics import PAPER_AVERAGE, PAPER_SCORES, glue_average
from .glue_protocol import PAPER_GRID, Protocol, RunSpec, data_source

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------------
# Which runs
# --------------------------------------------------------------------------------------------------------


def grid_specs(tasks: Iterable[str], batch_sizes: Sequence[int] = PAPER_GRID["batch_size"],
               learning_rates: Sequence[float] = PAPER_GRID["learning_rate"],
               weight_decays: Sequence[float] = PAPER_GRID["weight_decay"], seeds: Sequence[int] = (0,),
               transfer: bool = True) -> List[RunSpec]:
    """The cartesian grid per task; invalid values (batch < 1, lr <= 0, wd < 0) are dropped, and a grid left
    with no point at all is an error naming what was given."""
    tasks = [get_task(t) for t in tasks]
    points = [(b, lr, wd, s) for b, lr, wd, s in product(batch_sizes, learning_rates, weight_decays, seeds)
              if int(b) >= 1 and float(lr) > 0 and float(wd) >= 0]
    if not tasks or not points:
        raise ValueError(
            f"the GLUE grid has no valid point: tasks={[t.name for t in tasks]}, batch_sizes={list(batch_sizes)}, "
            f"learning_rates={list(learning_rates)}, weight_decays={list(weight_decays)}, seeds={list(seeds)} "
            f"(need batch >= 1, lr > 0, wd >= 0)"
        )
    return [RunSpec(t.name, int(b), float(lr), float(wd), int(s), "mnli" if transfer and t.transfer_from_mnli
                    else "pretrained") for t in tasks for b, lr, wd, s in points]


def preset_specs(preset: Mapping[str, Mapping], tasks: Optional[Iterable[str]] = None, seeds: Sequence[int] = (0,),
                 transfer: bool = True) -> List[RunSpec]:
    """One run per task (and seed) with the preset's best settings: {"RTE": {"batch_size": 16, ...}, ...}."""
    preset = {get_task(k).name: v for k, v in preset.items()}
    names = [get_task(t).name for t in tasks] if tasks else list(preset)
    missing = [n for n in names if n not in preset]
    if missing:
        raise ValueError(f"the preset has no settings for {missing}; it covers {sorted(preset)}")
    specs = []
    for name in names:
        p = preset[name]
        specs += grid_specs([name], [p["batch_size"]], [p["learning_rate"]], [p["weight_decay"]], seeds, transfer)
    return specs


# --------------------------------------------------------------------------------------------------------
# Stored results
# --------------------------------------------------------------------------------------------------------


def load_records(output_dir) -> List[dict]:
    runs = Path(output_dir) / "runs"
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(runs.glob("*.json"))] if runs.is_dir() else []


def best_per_task(records: Iterable[dict]) -> Dict[str, dict]:
    best = {}
    for r in records:
        if r["task"] not in best or r["score"] > best[r["task"]]["score"]:
            best[r["task"]] = r
    return {t: best[t] for t in TASKS if t in best}


def best_mnli_checkpoint(output_dir) -> Optional[str]:
    """The checkpoint of the best-scoring MNLI run that kept one."""
    runs = [r for r in load_records(output_dir) if r["task"] == "MNLI" and r.get("checkpoint")
            and Path(r["checkpoint"]).is_dir()]
    return max(runs, key=lambda r: r["score"])["checkpoint"] if runs else None


def _prune_mnli_checkpoints(output_dir) -> None:
    best = best_mnli_checkpoint(output_dir)
    for r in load_records(output_dir):
        if r["task"] == "MNLI" and r.get("checkpoint") and r["checkpoint"] != best and Path(r["checkpoint"]).is_dir():
            shutil.rmtree(r["checkpoint"])


def report(output_dir) -> dict:
    """results.json (all runs, best per task, average), results.md (beside the paper) and preset.json."""
    records = load_records(output_dir)
    best = best_per_task(records)
    scores = {t: 100 * r["score"] for t, r in best.items()}
    summary = {
        "best": {t: {"key": r["key"], "score": 100 * r["score"], "metrics": r["metrics"]} for t, r in best.items()},
        "average": glue_average(scores) if len(scores) == len(TASKS) else None,
        "paper": {"scores": PAPER_SCORES, "average": PAPER_AVERAGE},
        "runs": records,
    }
    write_json_atomic(Path(output_dir) / "results.json", summary)
    write_json_atomic(Path(output_dir) / "preset.json", {
        t: {"batch_size": r["batch_size"], "learning_rate": r["learning_rate"], "weight_decay": r["weight_decay"]}
        for t, r in best.items()})
    lines = ["| model | " + " | ".join(TASKS) + " | average |", "| --- " * (len(TASKS) + 2) + "|"]
    ours = [f"{scores[t]:.1f}" if t in scores else "-" for t in TASKS]
    avg = f"{summary['average']:.1f}" if summary["average"] is not None else f"- ({len(scores)}/{len(TASKS)} tasks)"
    lines.append("| ours | " + " | ".join(ours) + f" | {avg} |")
    lines.append("| NeoBERT (paper) | " + " | ".join(f"{PAPER_SCORES[t]:.1f}" for t in TASKS) + f" | {PAPER_AVERAGE:.1f} |")
    lines += ["", f"{len(records)} runs; best per task: " + ", ".join(f"{t}: {r['key']}" for t, r in best.items())]
    write_text_atomic(Path(output_dir) / "results.md", "\n".join(lines) + "\n")
    return summary


# --------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------

_DEVICE = None


def _claim_device(queue) -> None:
    global _DEVICE
    _DEVICE = queue.get()


def _run_one(job: dict) -> dict:
    """Runs one job and stores its record; in a pool worker the device comes from `_claim_device`."""
    device = job.pop("device", None) or _DEVICE
    if str(device).startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    record_path = Path(job.pop("record_path"))
    revision = job.pop("model_revision")
    record = dict(fine_tune(device=device, **job), model_revision=revision)
    write_json_atomic(record_path, record)
    return record


def _execute(jobs: List[dict], devices: Sequence[str], progress: bool) -> List[str]:
    """Runs jobs sequentially (one device) or in a process pool with one worker per device; returns the
    errors of failed runs (the others are stored whatever happens to their neighbours)."""
    errors = []
    outer = progress_bar(total=len(jobs), desc="GLUE runs", enabled=progress, every=0)  # a line per run in a log
    if len(devices) <= 1:
        for job in jobs:
            key = job["spec"].key
            try:
                _run_one(dict(job, device=devices[0] if devices else "cpu"))
            except Exception as e:  # one failing point (e.g. out of memory) must not cost the rest
                logger.exception("GLUE run %s failed", key)
                errors.append(f"{key}: {type(e).__name__}: {e}")
            outer.update(1)
    else:
        ctx = mp.get_context("spawn")  # CUDA cannot be used in forked children
        queue = ctx.Manager().Queue()
        for d in devices:
            queue.put(d)
        with ProcessPoolExecutor(len(devices), mp_context=ctx, initializer=_claim_device, initargs=(queue,)) as pool:
            futures = {pool.submit(_run_one, dict(job, progress=False)): job["spec"].key for job in jobs}
            for future in as_completed(futures):
                try:
                    future.result()
                except Exception as e:
                    logger.error("GLUE run %s failed: %s", futures[future], e)
                    errors.append(f"{futures[future]}: {type(e).__name__}: {e}")
                outer.update(1)
    outer.close()
    return errors


def default_devices() -> List[str]:
    n = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(n)] if n else ["cpu"]


def model_revision(model_path) -> Optional[str]:
    """The hash of a local folder's weights, config and tokenizer (None for a Hub name): a folder exported
    again with other weights is another model under the same path."""
    return checkpoint_revision(model_path) if Path(model_path).is_dir() else None


def this_revision(records: List[dict], model_key: str, revision: Optional[str]) -> List[dict]:
    """The records of this revision of the model (those of other weights or another tokenizer under the same
    path, or stored without a revision, are not this model's)."""
    return [r for r in records if r["model"] != model_key or r.get("model_revision") == revision]


def set_aside_other_revisions(records: List[dict], output_dir, model_key: str, revision: Optional[str]) -> List[dict]:
    """The records of this revision of the model. Runs of the same path with other weights or another tokenizer
    (or stored without a revision) move, with their checkpoints, to superseded/{their revision}/, so that they
    are run again and never reported as this model's."""
    current = this_revision(records, model_key, revision)
    old = [r for r in records if r not in current]
    for r in old:
        folder = Path(output_dir) / "superseded" / (r.get("model_revision") or "unknown")
        (folder / "runs").mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "runs" / f"{r['key']}.json").replace(folder / "runs" / f"{r['key']}.json")
        if r.get("checkpoint") and Path(r["checkpoint"]).is_dir():
            moved = folder / "checkpoints" / Path(r["checkpoint"]).name
            moved.parent.mkdir(exist_ok=True)
            shutil.rmtree(moved, ignore_errors=True)  # set aside before: these runs are newer
            Path(r["checkpoint"]).replace(moved)
    if old:
        logger.warning("%s changed since %d stored GLUE run(s) (revision %s, now %s): they are moved to %s and "
                       "run again", model_key, len(old), old[0].get("model_revision") or "unknown", revision,
                       Path(output_dir) / "superseded")
    return current


def check_run_inputs(model_path, tasks: Sequence[str], data_dir=None) -> None:
    """What every run of `tasks` reads, checked once before the grid so that bad input is one line, not the same
    traceback in each run: the model's config, its tokenizer, and (with `data_dir`) every task file, whole."""
    from transformers import AutoTokenizer

    check_model_source(model_path)
    if Path(model_path).is_dir():  # a Hub name's config is read by the runs' own load
        load_neobert_auto_config(model_path)
    try:
        AutoTokenizer.from_pretrained(str(model_path), trust_remote_code=True)
    except Exception as err:  # OSError, ValueError, a tokenizer class that does not import: it does not load
        raise ValueError(f"--model {model_path}: its tokenizer does not load ({type(err).__name__}: {err})") from None
    if data_dir is not None:
        check_tsv_files(tasks, data_dir)


def check_same_settings(records: Iterable[dict], output_dir, model_key: str, protocol: Protocol, data: str) -> None:
    """A stored run counts as finished only when the model, the data and every protocol setting that shaped it
    are this grid's; results of other settings in the same folder would be reported as this grid's."""
    wanted = asdict(protocol)
    for r in records:
        if r["model"] != model_key:
            raise ValueError(f"{output_dir} holds results of another model ({r['model']}, run {r['key']}); "
                             f"use a separate output_dir for {model_key}")
        changed = [f"{k}={r['protocol'].get(k)!r} (now {v!r})" for k, v in wanted.items() if r["protocol"].get(k) != v]
        if r.get("data") != data:
            changed.append(f"data={r.get('data')!r} (now {data!r})")
        if changed:
            raise ValueError(f"{output_dir} holds run {r['key']} made with other settings: {', '.join(changed)}; "
                             f"use a separate output_dir for these settings (or the same settings to resume)")


def run_glue(
    model_path,
    output_dir,
    specs: Sequence[RunSpec],
    protocol: Protocol = Protocol(),
    data_dir=None,
    dataset_name: str = HF_DATASET,
    devices: Optional[Sequence[str]] = None,
    mnli_checkpoint=None,
    keep_mnli_checkpoints: bool = False,
    progress: bool = True,
) -> dict:
    """Runs the `specs` not finished yet, then writes the report (see the module docstring).

    Runs from the pretrained model (MNLI among them) go first; runs with `init == "mnli"` then start from
    `mnli_checkpoint`, or else from the best MNLI checkpoint stored in `output_dir`. Only that best MNLI
    checkpoint is kept unless `keep_mnli_checkpoints` (a full grid would otherwise store 60 copies of the model).
    """
    output_dir = Path(output_dir)
    model_key = str(Path(model_path).resolve()) if Path(model_path).exists() else str(model_path)
    devices = list(devices) if devices else default_devices()
    if not specs:
        raise ValueError("no GLUE runs requested")
    records = load_records(output_dir)
    check_same_settings(records, output_dir, model_key, protocol, data_source(data_dir, dataset_name))
    check_model_source(model_path)  # before its files are hashed
    revision = model_revision(model_path)
    done = {r["key"] for r in this_revision(records, model_key, revision)}
    pending = [s for s in dict.fromkeys(specs) if s.key not in done]
    if len(pending) < len(specs):
        logger.info("%d of %d GLUE runs already finished in %s", len(specs) - len(pending), len(specs), output_dir)
    if pending:
        check_run_inputs(model_path, sorted({s.task for s in pending}), data_dir)
    transfer = [s for s in pending if s.init == "mnli"]
    if transfer and not mnli_checkpoint and not best_mnli_checkpoint(output_dir) and not any(
            s.task == "MNLI" for s in pending):
        # Checked before any run: otherwise the other tasks would train first and the grid fail at the end.
        raise ValueError(
            f"{sorted({s.task for s in transfer})} start from the best MNLI checkpoint, but {output_dir} holds "
            f"no finished MNLI run with a checkpoint and MNLI is not among the tasks: include MNLI in --tasks, "
            f"give one with --mnli-checkpoint, or start every task from the model with --no-transfer")

    set_aside_other_revisions(records, output_dir, model_key, revision)  # the grid's first write

    def job(spec, init_path=None):
        return {"model_path": model_path, "model_revision": revision, "spec": spec, "protocol": protocol,
                "data_dir": data_dir, "dataset_name": dataset_name, "init_path": init_path, "progress": progress,
                "checkpoint_dir": output_dir / "checkpoints" / spec.key if spec.task == "MNLI" else None,
                "record_path": output_dir / "runs" / f"{spec.key}.json"}

    errors = _execute([job(s) for s in pending if s.init != "mnli"], devices, progress)
    if not keep_mnli_checkpoints:
        _prune_mnli_checkpoints(output_dir)
    if transfer:
        source = mnli_checkpoint or best_mnli_checkpoint(output_dir)
        if source is None:
            raise RuntimeError(f"no MNLI run left a checkpoint, so {sorted({s.task for s in transfer})} have none "
                               f"to start from; failed runs:\n" + "\n".join(errors))
        errors += _execute([job(s, init_path=source) for s in transfer], devices, progress)
    summary = report(output_dir)
    if errors:
        raise RuntimeError(f"{len(errors)} GLUE run(s) failed (finished runs are stored):\n" + "\n".join(errors))
    return summary


__all__ = ["grid_specs", "preset_specs", "load_records", "best_per_task", "best_mnli_checkpoint", "report",
           "check_run_inputs", "check_same_settings", "model_revision", "this_revision", "set_aside_other_revisions",
           "run_glue", "default_devices", "write_json_atomic"]
