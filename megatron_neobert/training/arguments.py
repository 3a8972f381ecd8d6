"""Command-line arguments of the pre-training script, with Megatron-LM's spellings.

Defaults reproduce NeoBERT's recipe: AdamW (0.9, 0.95, 1e-8), weight decay 0.1,
gradient clipping 1.0, 2,000 warmup steps to 6e-4, cosine decay to 10% of the peak over 90% of
the steps then constant, 20% masking all replaced by [MASK], 1024 tokens, 2M tokens per step.
A `--config` YAML file holds the same settings (keys are flag names, with - or _); flags given
on the command line override it.
"""

import argparse
import os
from typing import List, Optional

import yaml

from megatron_neobert.cli import ArgumentParser
from megatron_neobert.data.tokenizer import TOKENIZER_TYPES
from megatron_neobert.model import PRESETS
from megatron_neobert.training.errors import InputError
from megatron_neobert.training.process_guards import EXIT_SIGNALS
from megatron_neobert.training.megatron_args import add_megatron_lm_args, apply_megatron_lm_args, explicit_dests
from megatron_neobert.training.validation import validate_precision_args

# Architecture overrides of the preset (Megatron-LM names) -> NeoBERTArch fields.
ARCH_OVERRIDES = {
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "ffn_hidden_size": "ffn_hidden_size",
    "max_position_embeddings": "max_sequence_length",
    "vocab_size": "vocab_size",
}


def build_parser() -> argparse.ArgumentParser:
    # The shared parser refuses abbreviations: Megatron-LM's --exit-signal must not be read as a prefix of
    # another flag.
    p = ArgumentParser(prog="neobert-pretrain", description="Pre-train NeoBERT with megatron-core.")
    p.add_argument("--config", help="YAML file of settings (flag names as keys); flags override it")

    g = p.add_argument_group("model")
    g.add_argument("--model-preset", default="neobert-250m", choices=sorted(PRESETS),
                   help="architecture preset (neobert-250m is the published model)")
    for name in ARCH_OVERRIDES:
        g.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help="override the preset's value")
    g.add_argument("--transformer-impl", default="auto", choices=["auto", "transformer_engine", "local"],
                   help="layer implementation: Transformer Engine, megatron-core's local layers, or auto (TE when it imports on a GPU)")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="pad the vocabulary to a multiple of this x TP (a loaded checkpoint's padding wins)")
    g.add_argument("--recompute-granularity", default=None, choices=["full", "selective"],
                   help="activation recomputation: full layers or selective (attention core)")
    g.add_argument("--recompute-method", default="uniform", choices=["uniform", "block"],
                   help="with full recomputation: uniform chunks or the first N layers of a stage (block)")
    g.add_argument("--recompute-num-layers", type=int, default=1,
                   help="layers per recomputed chunk (uniform) or recomputed layers per stage (block)")

    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1, help="tensor-parallel ranks per layer")
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1, help="pipeline stages")
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None,
                   help="layers per virtual stage: interleaved 1F1B")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="split norms and dropout activations along the sequence across TP ranks")
    g.add_argument("--use-distributed-optimizer", action="store_true",
                   help="shard the optimizer state and fp32 main weights across data-parallel ranks")
    g.add_argument("--overlap-grad-reduce", action="store_true",
                   help="reduce gradients bucket by bucket during the backward pass")
    g.add_argument("--overlap-param-gather", action="store_true",
                   help="all-gather updated parameters during the next forward (needs --use-distributed-optimizer)")
    g.add_argument("--ddp-bucket-size", type=int, default=None,
                   help="parameters per gradient-reduction bucket with --overlap-grad-reduce (default: "
                        "megatron-core's, max(40M, 1M x DP))")

    g = p.add_argument_group("precision")
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 weights and activations, fp32 main weights (default: on with a GPU, off on CPU)")
    g.add_argument("--fp8-format", default=None, choices=["e4m3", "hybrid"], help="needs Transformer Engine")
    g.add_argument("--fp8-recipe", default="delayed", choices=["tensorwise", "delayed", "mxfp8", "blockwise"],
                   help="Transformer Engine FP8 scaling recipe (mxfp8 needs Blackwell)")

    g = p.add_argument_group("batch and schedule")
    g.add_argument("--micro-batch-size", type=int, default=32)
    g.add_argument("--global-batch-size", type=int, default=2048,
                   help="sequences per optimizer step (2048 x 1024 = 2M tokens)")
    g.add_argument("--seq-length", type=int, default=1024)
    g.add_argument("--train-iters", type=int, default=1_000_000)
    g.add_argument("--lr", type=float, default=6e-4)
    g.add_argument("--min-lr", type=float, default=None)
    g.add_argument("--lr-warmup-iters", type=int, default=2000)
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--lr-decay-style", default="cosine", choices=["cosine", "linear", "constant"])
    g.add_argument("--override-opt-param-scheduler", action="store_true",
                   help="take the schedule from the flags, not from the loaded checkpoint")
    g.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "adam-l2"],
                   help="adam: Adam with decoupled weight decay (AdamW), as Megatron-LM's adam; adamw: the "
                        "same; adam-l2: weight decay as an L2 penalty in the gradient (torch.optim.Adam, "
                        "the BERT-like ablation M0)")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--adam-beta1", type=float, default=0.9, help="Adam's first-moment decay")
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8, help="Adam's epsilon")
    g.add_argument("--clip-grad", type=float, default=1.0, help="clip the global gradient norm to this (0: no clipping)")
    g.add_argument("--max-skipped-iters", type=int, default=10,
                   help="stop after this many consecutive steps skipped for a non-finite loss or gradient")
    g.add_argument("--seed", type=int, default=1234, help="random seed of weights, data order and masks")

    g = p.add_argument_group("data")
    g.add_argument("--data-path", nargs="+", default=None,
                   help="prefixes of .bin/.idx datasets, or weight-prefix pairs (0.2 A 0.4 B 0.4 C)")
    g.add_argument("--data-args-path", default=None,
                   help="a file holding what --data-path would (many prefixes and weights)")
    g.add_argument("--per-split-data-args-path", default=None,
                   help='JSON {"train": ..., "valid": ..., "test": ...}, each like --data-path '
                        "(--split is then unused)")
    g.add_argument("--split", default="949,50,1")
    g.add_argument("--data-cache-path", default=None,
                   help="folder of the datasets' layout caches (default: cache/ beside each dataset)")
    g.add_argument("--tokenizer-type", default="HuggingFaceTokenizer", choices=TOKENIZER_TYPES,
                   help="as Megatron-LM's; BertWordPiece* read --vocab-file")
    g.add_argument("--tokenizer-model", default="bert-base-uncased",
                   help="Hugging Face name or folder, or a SentencePiece .model file")
    g.add_argument("--mask-rate", type=float, default=0.2, help="fraction of tokens masked for the MLM loss")
    g.add_argument("--mask-scheme", default="mask", choices=["mask", "80/10/10"],
                   help="mask: every chosen token becomes [MASK]; 80/10/10: BERT's mask/random/keep")
    g.add_argument("--packed", action=argparse.BooleanOptionalAction, default=True,
                   help="pack documents with per-document attention (cu_seqlens), or pad")
    g.add_argument("--data-loader", default="torch", choices=["torch", "dali"], help="PyTorch DataLoader or NVIDIA DALI")
    g.add_argument("--num-workers", type=int, default=2, help="data-loader worker processes per rank")

    g = p.add_argument_group("checkpoints")
    g.add_argument("--save", default=None, help="checkpoint root to save to")
    g.add_argument("--load", default=None, help="checkpoint root to resume from (its latest complete iteration)")
    g.add_argument("--save-interval", type=int, default=None,
                   help="save every this many iterations (also at the end and when stopping early)")
    g.add_argument("--keep-last-n-checkpoints", type=int, default=None,
                   help="delete all but the newest N iteration folders after each save")
    g.add_argument("--no-load-optim", action="store_true",
                   help="load the model (and schedule position), start with a fresh optimizer state")
    g.add_argument("--no-load-rng", action="store_true", help="do not restore the RNG states of the checkpoint")
    g.add_argument("--finetune", action="store_true",
                   help="load the model only; iteration, data position, optimizer and schedule start at 0")
    g.add_argument("--exit-signal-handler", action="store_true",
                   help="on --exit-signal save a checkpoint and exit cleanly")
    g.add_argument("--exit-interval", type=int, default=None, help="save and exit at this iteration")

    add_fault_tolerance_args(p)

    g = p.add_argument_group("logging and evaluation")
    g.add_argument("--log-interval", type=int, default=100, help="iterations per console and TensorBoard line")
    g.add_argument("--eval-interval", type=int, default=1000, help="iterations between validations (0: none)")
    g.add_argument("--eval-iters", type=int, default=100, help="global batches per validation")
    g.add_argument("--tensorboard-dir", default=None, help="write TensorBoard events here (rank 0)")
    g.add_argument("--profile", action="store_true",
                   help="PyTorch profiler over steps --profile-step-start + 1 .. --profile-step-end: a trace "
                        "in --tensorboard-dir (else --save/profile) and the top operators in the log")
    g.add_argument("--profile-step-start", type=int, default=10,
                   help="with --profile: the step after which profiling starts")
    g.add_argument("--profile-step-end", type=int, default=12, help="with --profile: the last profiled step")
    g.add_argument("--profile-ranks", type=int, nargs="+", default=[0],
                   help="with --profile: the global ranks that profile")
    g.add_argument("--pytorch-profiler-collect-callstack", action="store_true",
                   help="Python stacks in the trace (larger trace, slower profiled steps)")

    add_megatron_lm_args(p)
    return p


def add_fault_tolerance_args(p: argparse.ArgumentParser) -> None:
    """Pre-emption, hangs, and what may be written to --save or loaded from --load."""
    g = p.add_argument_group("fault tolerance")
    g.add_argument("--exit-signal", default="SIGTERM", choices=list(EXIT_SIGNALS),
                   help="the signal --exit-signal-handler answers (as Megatron-LM)")
    g.add_argument("--exit-duration-in-mins", type=float, default=None,
                   help="save and exit once the run has lasted this long (all ranks stop at the same step)")
    g.add_argument("--distributed-timeout-minutes", type=float, default=10,
                   help="timeout of collectives; a watchdog line names the step after half of it")
    g.add_argument("--ckpt-step", type=int, default=None,
                   help="load this iteration of --load instead of the one its marker names")
    g.add_argument("--no-verify-checkpoint", action="store_true",
                   help="load without checking the files against the checkpoint's checksums")
    g.add_argument("--break-save-lock", action="store_true",
                   help="take over --save's lock held by a process on another host (when it is known dead)")
    g.add_argument("--overwrite-save", action="store_true",
                   help="start in a --save that holds another run's checkpoints, deleting them")


def _apply_config_file(parser: argparse.ArgumentParser, path: str) -> List[str]:
    with open(path) as f:
        settings = yaml.safe_load(f) or {}
    known = {a.dest for a in parser._actions}
    values = {}
    for key, value in settings.items():
        dest = key.replace("-", "_")
        if dest not in known or dest == "config":
            raise InputError(f"{path}: unknown setting {key!r}")
        values[dest] = value
    parser.set_defaults(**values)
    return list(values)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    config_keys = _apply_config_file(parser, first.config) if first.config else []
    args = parser.parse_args(argv)
    return validate(args, explicit_dests(build_parser, argv, config_keys))


def validate(args: argparse.Namespace, explicit=frozenset()) -> argparse.Namespace:
    """Check the settings and fill in the derived defaults; `explicit`: the settings the user gave
    (the others may take the recipe's defaults, reported at start-up)."""
    args.explicit_flags = sorted(explicit)
    apply_megatron_lm_args(args, explicit)
    if args.min_lr is None:
        args.min_lr = 0.1 * args.lr
    if args.lr_decay_iters is None:
        args.lr_decay_iters = int(0.9 * args.train_iters)
    if args.lr_decay_style == "constant":
        args.min_lr = args.lr
    if args.lr_warmup_iters >= args.lr_decay_iters:
        # The recipe's 2000 warm-up steps stop every short run here: say how to get past them.
        warmup = "" if "lr_warmup_iters" in explicit else " (the recipe's default)"
        decay = "" if "lr_decay_iters" in explicit else f" (90% of --train-iters {args.train_iters})"
        raise InputError(f"--lr-warmup-iters {args.lr_warmup_iters}{warmup} must be below --lr-decay-iters "
                         f"{args.lr_decay_iters}{decay}: for a short run pass --lr-warmup-iters 0 (or a few "
                         f"steps)")
    if args.overlap_param_gather and not args.use_distributed_optimizer:
        raise InputError("--overlap-param-gather needs --use-distributed-optimizer")
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:
        args.sequence_parallel = False  # as Megatron-LM: nothing to split
    if args.profile:
        if not 0 <= args.profile_step_start < args.profile_step_end <= args.train_iters:
            raise InputError(f"--profile-step-start {args.profile_step_start} and --profile-step-end "
                             f"{args.profile_step_end} must satisfy 0 <= start < end <= --train-iters "
                             f"{args.train_iters}")
        if not (args.tensorboard_dir or args.save):
            raise InputError("--profile writes its trace to --tensorboard-dir, else to --save/profile: "
                             "give one of them")
    sources = {"--data-path": args.data_path, "--data-args-path": args.data_args_path,
               "--per-split-data-args-path": args.per_split_data_args_path,
               "--train-data-path": args.train_data_path, "--mock-data": args.mock_data or None}
    given = [flag for flag, value in sources.items() if value is not None]
    if len(given) != 1:
        raise InputError(f"give exactly one of {', '.join(sources)} (got {', '.join(given) or 'none'}; "
                         "see tools/preprocess_data.py)")
    if os.path.exists(args.tokenizer_model):
        # A local tokenizer is recorded by its absolute path in the checkpoint's args, so that the
        # export and a resume find it from any working directory.
        args.tokenizer_model = os.path.abspath(args.tokenizer_model)
    return validate_precision_args(args)
