"""Fine-tune and evaluate a NeoBERT folder on GLUE with the paper's protocol (grid, early stopping, MNLI transfer).

    # the paper's full grid on every GPU present (resumable: rerun the same command after an interruption)
    neobert-run-glue --model /ckpt/neobert-hf --output-dir runs/glue
    # two tasks from local GLUE TSV folders, one setting each
    neobert-run-glue --model /ckpt/neobert-hf --output-dir runs/glue --data-dir /data/glue \\
        --tasks MNLI RTE --batch-sizes 16 --learning-rates 2e-5 --weight-decays 1e-2
    # the best settings of an earlier grid
    neobert-run-glue --model /ckpt/neobert-hf --output-dir runs/glue2 --preset runs/glue/preset.json
"""

import json
import logging
from pathlib import Path

from megatron_neobert.flags import ArgumentParser
from megatron_neobert.evaluation.glue_data import HF_DATASET, TASKS
from megatron_neobert.evaluation.glue_protocol import PAPER_GRID, Protocol


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="NeoBERT HF folder (exported or chandar-lab/NeoBERT)")
    p.add_argument("--output-dir", required=True,
                   help="runs/, checkpoints/, results.md/.json and preset.json go here; rerunning the same "
                        "command resumes (a folder holds one model, data and protocol)")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), help="GLUE tasks to run")
    p.add_argument("--data-dir", help="GLUE TSV folders ({data_dir}/{TASK}/train.tsv, dev.tsv; see docs/glue.md); "
                                      "default: --dataset-name from the Hub")
    p.add_argument("--dataset-name", default=HF_DATASET, help="Hub dataset read when there is no --data-dir")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=list(PAPER_GRID["batch_size"]),
                   help="grid of batch sizes")
    p.add_argument("--learning-rates", nargs="+", type=float, default=list(PAPER_GRID["learning_rate"]),
                   help="grid of peak learning rates")
    p.add_argument("--weight-decays", nargs="+", type=float, default=list(PAPER_GRID["weight_decay"]),
                   help="grid of AdamW weight decays")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="one run per seed and grid point")
    p.add_argument("--preset", help="JSON of best settings per task (an earlier grid's preset.json) instead of the grid")
    p.add_argument("--no-transfer", action="store_true",
                   help="start RTE, STS-B, MRPC and QNLI from the model instead of the best MNLI run")
    p.add_argument("--mnli-checkpoint", help="transfer source instead of the best MNLI run in --output-dir")
    p.add_argument("--keep-mnli-checkpoints", action="store_true", help="keep every MNLI run's best weights")
    p.add_argument("--devices", nargs="+", help="one run at a time per device (default: every GPU, else the CPU)")
    defaults = Protocol()
    p.add_argument("--epochs", type=int, default=defaults.epochs, help="training epochs per run")
    p.add_argument("--patience", type=int, default=defaults.patience,
                   help="evaluations without improvement before a run stops")
    p.add_argument("--max-length", type=int, default=defaults.max_length, help="tokens per example (truncated)")
    p.add_argument("--warmup-ratio", type=float, default=defaults.warmup_ratio,
                   help="share of the steps with a linear warmup (then linear decay)")
    p.add_argument("--eval-batch-size", type=int, default=defaults.eval_batch_size, help="examples per dev batch")
    p.add_argument("--max-train-examples", type=int, help="train on the first N examples only (smoke tests)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    from megatron_neobert.evaluation.glue_grid import grid_specs, preset_specs, run_glue

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
