"""Evaluate every checkpoint of a pre-training run downstream as it lands (GLUE, MTEB, pseudo-perplexity),
into the run's TensorBoard folder, downstream.jsonl and downstream.png (docs/watch.md).

    # beside a training run: follows --save until the checkpoint of its last iteration is evaluated
    neobert-watch-run --save runs/neobert/ckpt --suite suite.yaml --device cuda:1
    # a finished run, then exit
    neobert-watch-run --save runs/neobert/ckpt --suite suite.yaml --once
    # the ablation ladder: each run evaluated, all of them in one plot
    neobert-watch-run --compare runs/m0/ckpt runs/m1/ckpt --suite suite.yaml --once --plot ladder.png

Safe to stop and restart at any time: what is done (same weights, same settings) is never evaluated again.
"""

import sys

from megatron_neobert.cli import megatron_runtime
from megatron_neobert.flags import ArgumentParser


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__, allow_abbrev=False)
    runs = p.add_mutually_exclusive_group(required=True)
    runs.add_argument("--save", help="the run's checkpoint root (its --save)")
    runs.add_argument("--compare", nargs="+", metavar="RUN", help="several runs' checkpoint roots, plotted together")
    p.add_argument("--suite", required=True, help="YAML file of the tasks to run (docs/watch.md)")
    p.add_argument("--device", default=None, help="cpu or cuda:N (default: cuda when available, else cpu)")
    p.add_argument("--once", action="store_true", help="evaluate what is there and exit")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between looks at the run")
    p.add_argument("--output", default=None,
                   help="downstream.jsonl and downstream.png go here (default: RUN/downstream)")
    p.add_argument("--tensorboard-dir", default=None,
                   help="where the scores' events go (default: the run's --tensorboard-dir, else --output)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder for the export (default: the run's)")
    p.add_argument("--plot", default="downstream_compare.png", help="--compare: the PNG of every run's scores")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.compare and (args.output or args.tensorboard_dir):
        p.error("--output and --tensorboard-dir name one run's folders: with --compare each run uses its own")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from megatron_neobert.evaluation.watch import Run, check_run_folder, load_suite, watch

    roots = args.compare or [args.save]
    try:
        waiting = [check_run_folder(root, args.once) for root in roots]
        suite = load_suite(args.suite)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in filter(None, waiting):
        print(line, flush=True)
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    runs = [Run(root, suite, device, args.output, args.tensorboard_dir, args.tokenizer)
            for root in roots]
    with megatron_runtime():  # each checkpoint is converted in this process
        watch(runs, once=args.once, interval=args.interval, compare_plot=args.plot if args.compare else None)
    return 0
