#!/usr/bin/env python
"""Inference and training throughput of NeoBERT against its baselines, side by side, judged
against the project's targets (neobert-250m on one H100/H200), with the tables for README.

    python tools/benchmark_throughput.py --fp8 --compile   # GPU: the paper's settings
    python tools/benchmark_throughput.py --quick --fp8     # GPU: lengths 1024 and 4096, a few minutes
    python tools/benchmark_throughput.py --cpu-smoke       # CI: tiny, seconds, no timing claims

examples/benchmark_gpu.sh gives the runs behind README's figures.
"""

import dataclasses
import logging
import shlex
import sys
from dataclasses import dataclass
from typing import List, Optional

from megatron_neobert.flags import ArgumentParser, add_flags, setting


# --quick: the first look on a GPU within 180 s (neobert-250m on an H100: about 2 minutes estimated, docs/gpu.md
# gives the arithmetic): the two target lengths, the same 32k tokens per micro-batch at each, 2 warm-up and 5 timed steps
# per row, no compile (each compiled variant costs minutes). Every row is attempted: one that fails is recorded
# with its error. Flags given with it still win.
QUICK = dict(inference_seq_lengths=[1024, 4096], inference_max_batch=32, inference_steps=5,
             train_seq_lengths=[1024, 4096], train_tokens_per_micro_batch=32 * 1024, train_steps=5, compile=False)


# ---- targets (the project's, for neobert-250m on one H100/H200) --------------------------------------
TARGET_PRESET, TARGET_GPUS = "neobert-250m", ("H100", "H200")
TRAIN_TARGET_LENGTH, INFERENCE_TARGET_LENGTH = 1024, 4096
MIN_MFU, MIN_TRAINING_SPEEDUP, MIN_INFERENCE_SPEEDUP = 0.50, 3.0, 1.5
# FP8 must pay for itself and train as bf16 does: its losses, step by step from the same weights on the same
# micro-batches, within this fraction of bf16's from the step its scales are set (fp8_loss_gap).
MIN_FP8_SPEEDUP, MAX_FP8_LOSS_GAP = 1.25, 0.02


@dataclass
class TargetCheck:
    target: str
    threshold: str
    measured: Optional[str]  # the figure and the row it comes from, when there is one
    status: str  # "PASS", "FAIL" or "not measured (reason)"


def _verdict(target: str, threshold: str, figure: str, passed: bool, scope: Optional[str]) -> TargetCheck:
    # A figure from another GPU or model size says nothing about the target: shown, not judged.
    return TargetCheck(target, threshold, figure, f"not measured ({scope})" if scope else "PASS" if passed else "FAIL")


def _not_measured(target: str, threshold: str, reason: str) -> TargetCheck:
    return TargetCheck(target, threshold, None, f"not measured ({reason})")


def _failures(rows: list) -> str:
    return "; ".join(f"{r.label} {r.error}" for r in rows if r.error)


def check_targets(results: list, device: str, preset: str) -> List[TargetCheck]:
    """The project's targets against a run's measurements (evaluation.throughput.Measurement rows).
    `device`: the GPU's name (or "cpu")."""
    from megatron_neobert.evaluation.throughput import FP8_COMPARED_FROM_STEP, fp8_loss_gap

    scope = None
    if preset != TARGET_PRESET or not any(gpu in device for gpu in TARGET_GPUS):
        scope = f"targets are for {TARGET_PRESET} on one H100/H200; this run: {preset} on {device}"
    train = [r for r in results if r.benchmark == "training" and r.seq_length == TRAIN_TARGET_LENGTH]
    ours = [r for r in train if r.model.startswith("megatron") and r.error is None]
    bf16 = [r for r in ours if r.precision != "fp8"]  # fp32 on CPU
    not_run = f"training at length {TRAIN_TARGET_LENGTH} not run"
    checks = []

    target, threshold = f"training MFU, bf16, length {TRAIN_TARGET_LENGTH}", f">= {MIN_MFU:.0%}"
    best = max((r for r in bf16 if r.mfu is not None), key=lambda r: r.mfu, default=None)
    if best:
        checks.append(_verdict(target, threshold, f"{best.mfu:.1%} ({best.label})", best.mfu >= MIN_MFU, scope))
    else:
        checks.append(_not_measured(target, threshold, not_run if not train else
                                    f"no peak TFLOP/s known for {device}" if bf16 else
                                    _failures(train) or "no bf16 run of ours"))

    target = f"FP8 vs bf16 tokens/s, length {TRAIN_TARGET_LENGTH}"
    threshold = f">= {MIN_FP8_SPEEDUP:.2f}x, losses within {MAX_FP8_LOSS_GAP:.0%}"
    fp8 = [r for r in train if r.precision == "fp8"]
    pairs = [(r, b) for r in fp8 if r.error is None for b in bf16 if (b.model, b.compiled) == (r.model, r.compiled)]
    if pairs:
        f8, b = max(pairs, key=lambda p: p[0].tokens_per_s)
        ratio = f8.tokens_per_s / b.tokens_per_s
        gap = fp8_loss_gap(f8.losses, b.losses)
        losses = (f"losses within {gap:.1%} over steps {FP8_COMPARED_FROM_STEP}-{len(b.losses)}" if gap is not None
                  else "losses not recorded")
        checks.append(_verdict(target, threshold, f"{ratio:.2f}x ({f8.label} / {b.label}), {losses}",
                               ratio >= MIN_FP8_SPEEDUP and gap is not None and gap <= MAX_FP8_LOSS_GAP, scope))
    else:
        checks.append(_not_measured(target, threshold, not_run if not train else _failures(fp8) or
                                    ("no bf16 run to compare with" if fp8 else "no FP8 run (--fp8)")))

    target, threshold = (f"training tokens/s vs the reference, length {TRAIN_TARGET_LENGTH}",
                         f">= {MIN_TRAINING_SPEEDUP:.1f}x")
    reference = [r for r in train if r.model == "reference-hf-padded" and not r.compiled and r.error is None]
    if reference and bf16:
        best = max(bf16, key=lambda r: r.tokens_per_s)
        ratio = best.tokens_per_s / reference[0].tokens_per_s
        checks.append(_verdict(target, threshold, f"{ratio:.2f}x ({best.label})", ratio >= MIN_TRAINING_SPEEDUP,
                               scope))
    else:
        checks.append(_not_measured(target, threshold, not_run if not train else
                                    _failures(train) or "no reference run, or no bf16 run of ours"))

    target, threshold = (f"inference tokens/s vs ModernBERT-base, length {INFERENCE_TARGET_LENGTH}",
                         f">= {MIN_INFERENCE_SPEEDUP:.1f}x")
    inference = [r for r in results if r.benchmark == "inference" and r.seq_length == INFERENCE_TARGET_LENGTH]
    neobert = [r for r in inference if r.model.startswith("neobert") and r.error is None]
    modernbert = [r for r in inference if r.model == "modernbert-base" and r.error is None]
    if neobert and modernbert:
        ours_best = max(neobert, key=lambda r: r.tokens_per_s)
        theirs_best = max(modernbert, key=lambda r: r.tokens_per_s)
        ratio = ours_best.tokens_per_s / theirs_best.tokens_per_s
        checks.append(_verdict(target, threshold, f"{ratio:.2f}x ({ours_best.label} / {theirs_best.label})",
                               ratio >= MIN_INFERENCE_SPEEDUP, scope))
    else:
        checks.append(_not_measured(target, threshold, f"inference at length {INFERENCE_TARGET_LENGTH} not run"
                                    if not inference else _failures(inference) or "no ModernBERT-base run"))
    return checks


def format_targets(checks: List[TargetCheck]) -> str:
    return "\n".join(f"{c.target}: {c.measured or '-'} (target {c.threshold}) {c.status}" for c in checks)


def _markdown_row(cells: List[str], width: int) -> str:
    return "| " + " | ".join(cells + [""] * (width - len(cells))) + " |"


def format_markdown(results: list, checks: List[TargetCheck], meta: dict) -> str:
    """The results table and the targets, ready to paste into README."""
    from megatron_neobert.evaluation.throughput import COLUMNS, table_cells

    n = len(COLUMNS)
    table = [_markdown_row(COLUMNS, n), _markdown_row(["---"] * n, n)]
    table += [_markdown_row(table_cells(r), n) for r in results]
    targets = [_markdown_row(["target", "measured", "threshold", "result"], 4), _markdown_row(["---"] * 4, 4)]
    targets += [_markdown_row([c.target, c.measured or "-", c.threshold, c.status], 4) for c in checks]
    header = f"Measured on {meta['device']} (torch {meta['torch']}): `{meta['command']}`"
    return "\n".join([header, ""] + table + [""] + targets) + "\n"


def as_json(results: list, checks: List[TargetCheck], meta: dict) -> dict:
    return {"meta": meta, "results": [dict(dataclasses.asdict(r), label=r.label) for r in results],
            "targets": [dataclasses.asdict(c) for c in checks]}


@dataclasses.dataclass(frozen=True)
class ThroughputFlags:
    model_preset: str = setting("neobert-250m", "the architecture to time")
    inference_seq_lengths: List[int] = setting([512, 1024, 2048, 4096, 8192], "inference sequence lengths")
    inference_max_batch: int = setting(512, "largest inference batch tried (the largest that fits is used)")
    inference_steps: int = setting(100, "timed steps per point (paper: 100)")
    train_seq_lengths: List[int] = setting([1024, 4096], "training sequence lengths")
    train_micro_batch: int = setting(32, "sequences per micro-batch")
    train_tokens_per_micro_batch: Optional[int] = setting(
        None, "instead of --train-micro-batch: this many tokens per micro-batch at each length")
    train_micro_batches: int = setting(1, "micro-batches per step (gradient accumulation, as the trainer's global "
                                          "batch)")
    train_steps: int = setting(20, "timed training steps per variant")
    fp8: bool = setting(False, "also FP8 (needs Transformer Engine on Hopper)")
    compile: bool = setting(False, "also torch.compile'd variants, beside their eager models in the same run")
    no_baselines: bool = setting(False, "skip ModernBERT-base and BERT-base")
    skip_inference: bool = setting(False, "time training only")
    skip_training: bool = setting(False, "time inference only")
    quick: bool = setting(False, "lengths 1024 and 4096, 5 timed steps, 32k tokens per micro-batch, no compile, every "
                                 "row attempted (a failing one recorded with its error): under 3 minutes on an H100 "
                                 "(flags given beside it win)")
    cpu_smoke: bool = setting(False, "tiny preset and shapes so that the script runs in CI; figures mean nothing")
    output_json: str = setting("throughput.json", "every measurement, the targets and the settings")
    output_png: str = setting("throughput.png", "plot of the measurements")
    markdown: Optional[str] = setting(None, "also write the table and the targets as Markdown, for README",
                                      metavar="PATH")
    no_plot: bool = setting(False, "write no --output-png")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    add_flags(p, ThroughputFlags)
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
        args.train_tokens_per_micro_batch = None  # --quick's, which would size the micro-batch instead
    return args


def smoke_arch():
    """The tiny preset cut to the size of the baselines' smoke configs."""
    from megatron_neobert.model import get_arch

    return get_arch("neobert-tiny", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96)


def measure(args, arch, on_row) -> list:
    """The inference and training rows the flags ask for, each passed to on_row(row) as it is measured. Under
    --quick a row that fails is recorded with its error and the rest still run."""
    from megatron_neobert.evaluation.throughput import benchmark_inference, benchmark_training

    results = []
    if not args.skip_inference:
        results += benchmark_inference(arch, args.inference_seq_lengths, args.inference_steps,
                                       args.inference_max_batch, baselines=not args.no_baselines,
                                       small=args.cpu_smoke, compile=args.compile, keep_going=args.quick,
                                       on_row=on_row)
    if not args.skip_training:
        for seq in args.train_seq_lengths:
            micro_batch = (max(1, args.train_tokens_per_micro_batch // seq) if args.train_tokens_per_micro_batch
                           else args.train_micro_batch)
            results += benchmark_training(arch, seq, micro_batch, args.train_steps, args.train_micro_batches,
                                          fp8=args.fp8, compile=args.compile, keep_going=args.quick, on_row=on_row)
    return results


def main(argv=None):
    args = parse_args(argv)
    import importlib.util

    import torch

    from megatron_neobert.atomic_write import write_json_atomic, write_text_atomic
    from megatron_neobert.cli import megatron_runtime
    from megatron_neobert.evaluation.throughput import baseline_attention, format_table, plot
    from megatron_neobert.model.kernel_report import kernel_report
    from megatron_neobert.model import get_arch

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    command = shlex.join(["python", "tools/benchmark_throughput.py"] + (sys.argv[1:] if argv is None else argv))
    meta = dict(vars(args), command=command, device=device, torch=torch.__version__, kernels=kernel_report(),
                baseline_attention=baseline_attention())
    measured = []

    def write(results: list) -> List[TargetCheck]:
        """The JSON (and Markdown) of `results`: after every row, so that a run stopped by a time limit keeps them."""
        checks = check_targets(results, device, args.model_preset)
        write_json_atomic(args.output_json, as_json(results, checks, meta))
        if args.markdown:
            write_text_atomic(args.markdown, format_markdown(results, checks, meta))
        return checks

    def on_row(row):
        measured.append(row)
        write(measured)

    with megatron_runtime():
        results = measure(args, smoke_arch() if args.cpu_smoke else get_arch(args.model_preset), on_row)
    checks = write(results)  # with the ratios, known once each part is done
    print(format_table(results))
    print(format_targets(checks))
    written = [args.output_json] + ([args.markdown] if args.markdown else [])
    # The figures first: a plot that fails (or a run cut off while plotting) must not cost them.
    if not args.no_plot and importlib.util.find_spec("matplotlib") is None:
        print(f"no plot ({args.output_png}): matplotlib is not installed")
    elif not args.no_plot:
        plot(results, args.output_png)
        written.append(args.output_png)
    print("wrote " + ", ".join(written))
    return results, checks


if __name__ == "__main__":
    main()
