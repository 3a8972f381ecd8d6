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

import dataclasses
import sys
from typing import List, Optional

from megatron_neobert.cli import console_logging, megatron_runtime
from megatron_neobert.flags import ArgumentParser, add_flags, setting


@dataclasses.dataclass(frozen=True)
class WatchFlags:
    save: Optional[str] = setting(None, "the run's checkpoint root (its --save)", one_of="runs")
    compare: Optional[List[str]] = setting(None, "several runs' checkpoint roots, plotted together", metavar="RUN",
                                           one_of="runs")
    suite: Optional[str] = setting(None, "YAML file of the tasks to run (docs/watch.md)", required=True)
    device: Optional[str] = setting(None, "cpu or cuda:N (default: cuda when available, else cpu)")
    once: bool = setting(False, "evaluate what is there and exit")
    interval: float = setting(60.0, "seconds between looks at the run")
    output: Optional[str] = setting(None, "downstream.jsonl and downstream.png go here (default: RUN/downstream)")
    tensorboard_dir: Optional[str] = setting(
        None, "where the scores' events go (default: the run's --tensorboard-dir, else --output)")
    tokenizer: Optional[str] = setting(None, "tokenizer folder for the export (default: the run's)")
    plot: str = setting("downstream_compare.png", "--compare: the PNG of every run's scores")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    add_flags(p, WatchFlags)
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.compare and (args.output or args.tensorboard_dir):
        p.error("--output and --tensorboard-dir name one run's folders: with --compare each run uses its own")
    return args


@console_logging("%(levelname)s %(name)s: %(message)s")  # the kernels line of its exports, once
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
