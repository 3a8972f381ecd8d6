#!/usr/bin/env python
"""Inference and training throughput of NeoBERT against its baselines, side by side, judged
against the project's targets (neobert-250m on one H100/H200).

    python tools/benchmark_throughput.py --fp8 --compile   # GPU: the paper's settings
    python tools/benchmark_throughput.py --quick --fp8     # GPU: lengths 1024 and 4096, a few minutes
    python tools/benchmark_throughput.py --cpu-smoke       # CI: tiny, seconds, no timing claims

examples/benchmark_gpu.sh gives the runs behind README's figures.
"""

import logging
import os
import shlex
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir)))

from megatron_neobert.cli import ArgumentParser  # noqa: E402


# --quick: the first look on a GPU, within one 10-minute command (about 3 minutes for neobert-250m on an
# H100, estimated): the two target lengths, the same 32k tokens per micro-batch at each, a few timed steps,
# no compile (each compiled variant costs minutes). Flags given with it still win.
QUICK = dict(inference_seq_lengths=[1024, 4096], inference_max_batch=32, inference_steps=5,
             train_seq_lengths=[1024, 4096], train_tokens_per_micro_batch=32 * 1024, train_steps=5, compile=False)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--model-preset", default="neobert-250m", help="the architecture to time")
    p.add_argument("--inference-seq-lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192],
                   help="inference sequence lengths")
    p.add_argument("--inference-max-batch", type=int, default=512,
                   help="largest inference batch tried (the largest that fits is used)")
    p.add_argument("--inference-steps", type=int, default=100, help="timed steps per point (paper: 100)")
    p.add_argument("--train-seq-lengths", type=int, nargs="+", default=[1024, 4096], help="training sequence lengths")
    p.add_argument("--train-micro-batch", type=int, default=32, help="sequences per micro-batch")
    p.add_argument("--train-tokens-per-micro-batch", type=int, default=None,
                   help="instead of --train-micro-batch: this many tokens per micro-batch at each length")
    p.add_argument("--train-micro-batches", type=int, default=1,
                   help="micro-batches per step (gradient accumulation, as the trainer's global batch)")
    p.add_argument("--train-steps", type=int, default=20, help="timed training steps per variant")
    p.add_argument("--fp8", action="store_true", help="also FP8 (needs Transformer Engine on Hopper)")
    p.add_argument("--compile", action="store_true",
                   help="also torch.compile'd variants, beside their eager models in the same run")
    p.add_argument("--no-baselines", action="store_true", help="skip ModernBERT-base and BERT-base")
    p.add_argument("--skip-inference", action="store_true", help="time training only")
    p.add_argument("--skip-training", action="store_true", help="time inference only")
    p.add_argument("--quick", action="store_true",
                   help="lengths 1024 and 4096, 5 timed steps, 32k tokens per micro-batch, no compile: minutes on a "
                        "GPU (flags given beside it win)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny preset and shapes so that the script runs in CI; figures mean nothing")
    p.add_argument("--output-json", default="throughput.json", help="every measurement, the targets and the settings")
    p.add_argument("--output-png", default="throughput.png", help="plot of the measurements")
    p.add_argument("--markdown", default=None, metavar="PATH",
                   help="also write the table and the targets as Markdown, for README")
    p.add_argument("--no-plot", action="store_true", help="write no --output-png")
    return p


def parse_args(argv=None):
    parser = build_parser()
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        args.model_preset, args.inference_seq_lengths, args.inference_max_batch = "neobert-tiny", [64, 128], 2
        args.inference_steps, args.train_seq_lengths, args.train_micro_batch, args.train_steps = 1, [64], 2, 1
        args.train_micro_batches = 2  # the schedule's accumulation (no_sync) path
    return args


def smoke_arch():
    """The tiny preset cut to the size of the baselines' smoke configs."""
    from megatron_neobert.model import get_arch

    return get_arch("neobert-tiny", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96)


def main(argv=None):
    args = parse_args(argv)
    import torch

    from megatron_neobert.atomic_write import write_json_atomic, write_text_atomic
    from megatron_neobert.evaluation.throughput import (as_json, baseline_attention, benchmark_inference,
                                                        benchmark_training, check_targets, format_markdown,
                                                        format_table, format_targets, plot)
    from megatron_neobert.kernels import kernel_report
    from megatron_neobert.model import get_arch

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    arch = smoke_arch() if args.cpu_smoke else get_arch(args.model_preset)
    results = []
    if not args.skip_inference:
        results += benchmark_inference(arch, args.inference_seq_lengths, args.inference_steps,
                                       args.inference_max_batch, baselines=not args.no_baselines,
                                       small=args.cpu_smoke, compile=args.compile)
    if not args.skip_training:
        for seq in args.train_seq_lengths:
            micro_batch = (max(1, args.train_tokens_per_micro_batch // seq) if args.train_tokens_per_micro_batch
                           else args.train_micro_batch)
            results += benchmark_training(arch, seq, micro_batch, args.train_steps,
                                          args.train_micro_batches, fp8=args.fp8, compile=args.compile)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    checks = check_targets(results, device, args.model_preset)
    print(format_table(results))
    print(format_targets(checks))
    command = shlex.join(["python", "tools/benchmark_throughput.py"] + (sys.argv[1:] if argv is None else argv))
    meta = dict(vars(args), command=command, device=device, torch=torch.__version__, kernels=kernel_report(),
                baseline_attention=baseline_attention())
    # The figures first: a plot that fails (or a run cut off while plotting) must not cost them.
    write_json_atomic(args.output_json, as_json(results, checks, meta))
    written = [args.output_json]
    if args.markdown:
        write_text_atomic(args.markdown, format_markdown(results, checks, meta))
        written.append(args.markdown)
    if not args.no_plot:
        plot(results, args.output_png)
        written.append(args.output_png)
    print("wrote " + ", ".join(written))
    return results, checks


if __name__ == "__main__":
    main()
