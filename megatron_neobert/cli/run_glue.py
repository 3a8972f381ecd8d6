"""Fine-tune and evaluate a NeoBERT folder on GLUE with the paper's protocol (grid, early stopping, MNLI transfer).

    # the paper's full grid on every GPU present (resumable: rerun the same command after an interruption)
    neobert-run-glue --model /ckpt/neobert-hf --output-dir runs/glue
    # two tasks from local GLUE TSV folders, one setting each
    neobert-run-glue --model /ckpt/neobert-hf --output-dir runs/glue --data-dir /data/glue \\
        --tasks MNLI RTE --batch-sizes 16 --learning-rates 2e-5 --weight-decays 1e-2
    # the best settings of an earlier grid
    neobert-run-glue --model /ckpt/neobert-hf --output-dir runs/glue2 --preset runs/glue/preset.json
"""

import dataclasses
import json
from pathlib import Path
from typing import List, Optional

from megatron_neobert.cli import console_logging, require_extra
from megatron_neobert.flags import ArgumentParser, add_flags, setting
from megatron_neobert.evaluation.glue_data import HF_DATASET, TASKS
from megatron_neobert.evaluation.glue_protocol import PAPER_GRID, Protocol


@dataclasses.dataclass(frozen=True)
class GlueFlags:
    model: Optional[str] = setting(None, "NeoBERT HF folder (exported or chandar-lab/NeoBERT)", required=True)
    output_dir: Optional[str] = setting(
        None, "runs/, checkpoints/, results.md/.json and preset.json go here; rerunning the same command resumes "
              "(a folder holds one model, data and protocol)", required=True)
    tasks: List[str] = setting(list(TASKS), "GLUE tasks to run")
    data_dir: Optional[str] = setting(None, "GLUE TSV folders ({data_dir}/{TASK}/train.tsv, dev.tsv; see "
                                            "docs/glue.md); default: --dataset-name from the Hub")
    dataset_name: str = setting(HF_DATASET, "Hub dataset read when there is no --data-dir")
    batch_sizes: List[int] = setting(list(PAPER_GRID["batch_size"]), "grid of batch sizes")
    learning_rates: List[float] = setting(list(PAPER_GRID["learning_rate"]), "grid of peak learning rates")
    weight_decays: List[float] = setting(list(PAPER_GRID["weight_decay"]), "grid of AdamW weight decays")
    seeds: List[int] = setting([0], "one run per seed and grid point")
    preset: Optional[str] = setting(None, "JSON of best settings per task (an earlier grid's preset.json) instead "
                                          "of the grid")
    no_transfer: bool = setting(False, "start RTE, STS-B, MRPC and QNLI from the model instead of the best MNLI run")
    mnli_checkpoint: Optional[str] = setting(None, "transfer source instead of the best MNLI run in --output-dir")
    keep_mnli_checkpoints: bool = setting(False, "keep every MNLI run's best weights")
    devices: Optional[List[str]] = setting(None, "one run at a time per device (default: every GPU, else the CPU)")
    # The protocol's defaults are Protocol's.
    epochs: int = setting(Protocol.epochs, "training epochs per run")
    patience: int = setting(Protocol.patience, "evaluations without improvement before a run stops")
    max_length: int = setting(Protocol.max_length, "tokens per example (truncated)")
    warmup_ratio: float = setting(Protocol.warmup_ratio, "share of the steps with a linear warmup (then linear decay)")
    eval_batch_size: int = setting(Protocol.eval_batch_size, "examples per dev batch")
    max_train_examples: Optional[int] = setting(None, "train on the first N examples only (smoke tests)")
    no_progress: bool = setting(False, "no progress bars")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    add_flags(p, GlueFlags)
    return p


@console_logging("%(asctime)s %(levelname)s %(name)s: %(message)s")
def main(argv=None):
    args = build_parser().parse_args(argv)
    # The metrics always; the Hub's datasets only where there are no local TSV folders.
    require_extra("eval", "neobert-run-glue", ("scipy", "sklearn") + (() if args.data_dir else ("datasets",)))
    from megatron_neobert.evaluation.glue_grid import grid_specs, preset_specs, run_glue

    transfer = not args.no_transfer
    try:
        if args.preset:
            with open(args.preset, encoding="utf-8") as f:
                preset = json.load(f)
            tasks = args.tasks if args.tasks != list(TASKS) else None
            specs = preset_specs(preset, tasks, args.seeds, transfer)
        else:
            specs = grid_specs(args.tasks, args.batch_sizes, args.learning_rates, args.weight_decays, args.seeds,
                               transfer)
        protocol = Protocol(epochs=args.epochs, patience=args.patience, max_length=args.max_length,
                            warmup_ratio=args.warmup_ratio, eval_batch_size=args.eval_batch_size,
                            max_train_examples=args.max_train_examples)
        summary = run_glue(args.model, args.output_dir, specs, protocol, args.data_dir, args.dataset_name,
                           args.devices, args.mnli_checkpoint, args.keep_mnli_checkpoints,
                           progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as err:  # other settings in --output-dir, missing files, a bad preset
        raise SystemExit(f"error: {err}") from None
    print((Path(args.output_dir) / "results.md").read_text(encoding="utf-8"))
    return summary


def cli() -> None:
    """The neobert-run-glue command: main()'s results are printed and written, not its exit status."""
    main()
