#!/usr/bin/env python
"""Inference and training throughput of NeoBERT against its baselines, side by side.

    python tools/benchmark_throughput.py                       # GPU: the paper's settings
    python tools/benchmark_throughput.py --cpu-smoke           # CI: tiny, seconds, no timing claims
"""

import argparse
import json
import logging

import torch

from megatron_neobert.evaluation.throughput import (benchmark_inference, benchmark_training, format_table,
                                                    plot, write_json)
from megatron_neobert.model import get_arch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-preset", default="neobert-250m")
    p.add_argument("--inference-seq-lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--inference-max-batch", type=int, default=512)
    p.add_argument("--inference-steps", type=int, default=100, help="timed steps per point (paper: 100)")
    p.add_argument("--train-seq-lengths", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--train-micro-batch", type=int, default=32)
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--fp8", action="store_true", help="also FP8 (needs Transformer Engine on Hopper)")
    p.add_argument("--no-baselines", action="store_true", help="skip ModernBERT-base and BERT-base")
    p.add_argument("--skip-inference", action="store_true")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny preset and shapes so that the script runs in CI; figures mean nothing")
    p.add_argument("--output-json", default="throughput.json")
    p.add_argument("--output-png", default="throughput.png")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.model_preset, args.inference_seq_lengths, args.inference_max_batch = "neobert-tiny", [64, 128], 2
        args.inference_steps, args.train_seq_lengths, args.train_micro_batch, args.train_steps = 1, [64], 2, 1
    return args


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    arch = get_arch(args.model_preset)
    if args.cpu_smoke:  # keep the baselines and the model at test size
        arch = get_arch(args.model_preset, num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96)
    results = []
    if not args.skip_inference:
        results += benchmark_inference(arch, args.inference_seq_lengths, args.inference_steps,
                                       args.inference_max_batch, baselines=not args.no_baselines,
                                       small=args.cpu_smoke)
    if not args.skip_training:
        for seq in args.train_seq_lengths:
            results += benchmark_training(arch, seq, args.train_micro_batch, args.train_steps, fp8=args.fp8)
    print(format_table(results))
    meta = dict(vars(args), device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                torch=torch.__version__)
    write_json(results, args.output_json, meta)
    plot(results, args.output_png)
    print(f"wrote {args.output_json} and {args.output_png}")
    return results


if __name__ == "__main__":
    main()
