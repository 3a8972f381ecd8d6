#!/usr/bin/env python
"""Fine-tune and evaluate a NeoBERT folder on GLUE with the paper's protocol (grid, early stopping, MNLI transfer).

    # the paper's full grid on every GPU present (resumable: rerun the same command after an interruption)
    python tools/run_glue.py --model /ckpt/neobert-hf --output_dir runs/glue
    # two tasks from local GLUE TSV folders, one setting each
    python tools/run_glue.py --model /ckpt/neobert-hf --output_dir runs/glue --data_dir /data/glue \\
        --tasks MNLI RTE --batch_sizes 16 --learning_rates 2e-5 --weight_decays 1e-2
    # the best settings of an earlier grid
    python tools/run_glue.py --model /ckpt/neobert-hf --output_dir runs/glue2 --preset runs/glue/preset.json
"""

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_neobert.evaluation.glue import PAPER_GRID, Protocol  # noqa: E402
from megatron_neobert.evaluation.glue_data import HF_DATASET, TASKS  # noqa: E402
from megatron_neobert.evaluation.glue_grid import grid_specs, preset_specs, run_glue  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="NeoBERT HF folder (exported or chandar-lab/NeoBERT)")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), help=f"default: {' '.join(TASKS)}")
    p.add_argument("--data_dir", help="GLUE TSV folders ({data_dir}/{TASK}/train.tsv ...); default: the Hub")
    p.add_argument("--dataset_name", default=HF_DATASET)
    p.add_argument("--batch_sizes", nargs="+", type=int, default=list(PAPER_GRID["batch_size"]))
    p.add_argument("--learning_rates", nargs="+", type=float, default=list(PAPER_GRID["learning_rate"]))
    p.add_argument("--weight_decays", nargs="+", type=float, default=list(PAPER_GRID["weight_decay"]))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--preset", help="JSON of best settings per task (an earlier grid's preset.json)")
    p.add_argument("--no_transfer", action="store_true", help="start RTE, STS-B, MRPC, QNLI from the model")
    p.add_argument("--mnli_checkpoint", help="transfer source instead of the best MNLI run in output_dir")
    p.add_argument("--keep_mnli_checkpoints", action="store_true", help="keep every MNLI run's best weights")
    p.add_argument("--devices", nargs="+", help="default: every GPU, else the CPU")
    defaults = Protocol()
    p.add_argument("--epochs", type=int, default=defaults.epochs)
    p.add_argument("--patience", type=int, default=defaults.patience)
    p.add_argument("--max_length", type=int, default=defaults.max_length)
    p.add_argument("--warmup_ratio", type=float, default=defaults.warmup_ratio)
    p.add_argument("--eval_batch_size", type=int, default=defaults.eval_batch_size)
    p.add_argument("--max_train_examples", type=int, help="train on a slice (smoke tests)")
    p.add_argument("--no_progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    transfer = not args.no_transfer
    if args.preset:
        with open(args.preset, encoding="utf-8") as f:
            preset = json.load(f)
        tasks = args.tasks if args.tasks != list(TASKS) else None
        specs = preset_specs(preset, tasks, args.seeds, transfer)
    else:
        specs = grid_specs(args.tasks, args.batch_sizes, args.learning_rates, args.weight_decays, args.seeds, transfer)
    protocol = Protocol(epochs=args.epochs, patience=args.patience, max_length=args.max_length,
                        warmup_ratio=args.warmup_ratio, eval_batch_size=args.eval_batch_size,
                        max_train_examples=args.max_train_examples)
    summary = run_glue(args.model, args.output_dir, specs, protocol, args.data_dir, args.dataset_name,
                       args.devices, args.mnli_checkpoint, args.keep_mnli_checkpoints,
                       progress=not args.no_progress)
    print((Path(args.output_dir) / "results.md").read_text(encoding="utf-8"))
    return summary


if __name__ == "__main__":
    main()
