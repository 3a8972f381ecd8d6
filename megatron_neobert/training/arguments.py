"""The pre-training script's command line, with Megatron-LM's spellings, meanings and defaults.

Defaults reproduce NeoBERT's recipe: AdamW (0.9, 0.95, 1e-8), weight decay 0.1,
gradient clipping 1.0, 2,000 warmup steps to 6e-4, cosine decay to 10% of the peak over 90% of
the steps then constant, 20% masking all replaced by [MASK], 1024 tokens, 2M tokens per step.
A `--config` YAML file holds the same settings (keys are flag names, with - or _); flags given
on the command line override it. The flags are grouped by concern, one `--help` group per section of
`training/settings.py`, which turns the parsed command line into the run's settings.
"""

import argparse
from typing import List, Optional, Set, Tuple

import yaml

from megatron_neobert.cli import ArgumentParser
from megatron_neobert.data.tokenizer import add_tokenizer_flags
from megatron_neobert.model import PRESETS
from megatron_neobert.training.errors import InputError
from megatron_neobert.training.megatron_args import STRICTNESS, explicit_dests, note_recipe_defaults
from megatron_neobert.training.process_guards import EXIT_SIGNALS
from megatron_neobert.training.settings import (CheckpointSettings, DataSettings, EvaluationSettings, FaultSettings,
                                                LoggingSettings, ModelSettings, ParallelSettings, PrecisionSettings,
                                                ProfilingSettings, Settings, TrainingSettings, settings_from_args)

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
    p = ArgumentParser(prog="neobert-pretrain", description="Pre-train NeoBERT with megatron-core.",
                       error_class=InputError)  # one line, on rank 0, in place of the usage on every rank
    p.add_argument("--config", help="YAML file of settings (flag names as keys); flags override it")
    _add_model_args(p.add_argument_group(ModelSettings.TITLE))
    _add_precision_args(p.add_argument_group(PrecisionSettings.TITLE))
    _add_parallel_args(p.add_argument_group(ParallelSettings.TITLE))
    _add_training_args(p.add_argument_group(TrainingSettings.TITLE))
    _add_data_args(p.add_argument_group(DataSettings.TITLE))
    _add_checkpoint_args(p.add_argument_group(CheckpointSettings.TITLE))
    _add_fault_args(p.add_argument_group(FaultSettings.TITLE))
    _add_evaluation_args(p.add_argument_group(EvaluationSettings.TITLE))
    _add_logging_args(p.add_argument_group(LoggingSettings.TITLE))
    _add_profiling_args(p.add_argument_group(ProfilingSettings.TITLE))
    note_recipe_defaults(p)
    return p


def _add_model_args(g) -> None:
    g.add_argument("--model-preset", default="neobert-250m", choices=sorted(PRESETS),
                   help="architecture preset (neobert-250m is the published model)")
    for name in ARCH_OVERRIDES:
        g.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help="override the preset's value")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="pad the vocabulary to a multiple of this x TP (a loaded checkpoint's padding wins)")
    # Megatron-LM's architecture flags choose no architecture here (the preset does): checked against it.
    g.add_argument("--position-embedding-type", default=None, choices=["learned_absolute", "rope"],
                   help="must be the preset's (rope; learned_absolute: ablation-m0)")
    g.add_argument("--normalization", default=None, choices=["LayerNorm", "RMSNorm"],
                   help="must be the preset's (RMSNorm; LayerNorm: ablation-m0)")
    g.add_argument("--swiglu", action="store_true", help="must agree with the preset (SwiGLU but ablation-m0)")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true",
                   help="accepted: the MLM decoder is never tied to the embedding")
    g.add_argument("--bert-no-binary-head", action="store_true",
                   help="accepted: NeoBERT has no binary (next-sentence) head")
    g.add_argument("--hidden-dropout", type=float, default=0.0, help="dropout after attention and MLP")
    g.add_argument("--attention-dropout", type=float, default=0.0, help="dropout of the attention probabilities")
    g.add_argument("--init-method-std", type=float, default=None,
                   help="initialise weights ~ normal(0, std), the output projections scaled by "
                        "1/sqrt(2 x layers), as megatron-core")
    g.add_argument("--transformer-impl", default="auto", choices=["auto", "transformer_engine", "local"],
                   help="layer implementation: Transformer Engine, megatron-core's local layers, or auto (TE when it imports on a GPU)")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "flash", "fused", "unfused", "local"],
                   help="Transformer Engine's attention kernel (flash/fused/unfused need TE layers); local: "
                        "megatron-core layers with this package's attention")
    g.add_argument("--recompute-activations", action="store_true",
                   help="selective recomputation (= --recompute-granularity selective)")
    g.add_argument("--recompute-granularity", default=None, choices=["full", "selective"],
                   help="activation recomputation: full layers or selective (attention core)")
    g.add_argument("--recompute-method", default="uniform", choices=["uniform", "block"],
                   help="with full recomputation: uniform chunks or the first N layers of a stage (block)")
    g.add_argument("--recompute-num-layers", type=int, default=1,
                   help="layers per recomputed chunk (uniform) or recomputed layers per stage (block)")


def _add_precision_args(g) -> None:
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 weights and activations, fp32 main weights (default: on with a GPU, off on CPU)")
    g.add_argument("--fp16", action="store_true",
                   help="fp16 weights and activations, fp32 main weights, dynamic loss scaling")
    g.add_argument("--initial-loss-scale", type=float, default=2.0**32, help="with --fp16")
    g.add_argument("--loss-scale", type=float, default=None, help="with --fp16: a static scale instead")
    g.add_argument("--fp8-format", default=None, choices=["e4m3", "hybrid"], help="needs Transformer Engine")
    g.add_argument("--fp8-recipe", default="delayed", choices=["tensorwise", "delayed", "mxfp8", "blockwise"],
                   help="Transformer Engine FP8 scaling recipe (mxfp8 needs Blackwell)")


def _add_parallel_args(g) -> None:
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
    g.add_argument("--distributed-backend", default=None, choices=["nccl", "gloo"],
                   help="nccl on GPUs, gloo on CPU; the other one is refused")


def _add_training_args(g) -> None:
    g.add_argument("--micro-batch-size", type=int, default=32)
    g.add_argument("--global-batch-size", type=int, default=2048,
                   help="sequences per optimizer step (2048 x 1024 = 2M tokens)")
    g.add_argument("--rampup-batch-size", nargs=3, type=int, default=None, metavar=("START", "INCREMENT", "SAMPLES"),
                   help="not implemented: refused (the global batch is fixed)")
    g.add_argument("--train-iters", type=int, default=1_000_000)
    g.add_argument("--train-samples", type=int, default=None,
                   help="train for this many samples (instead of --train-iters): iterations = samples / "
                        "global batch; the schedule then counts samples")
    g.add_argument("--seed", type=int, default=1234, help="random seed of weights, data order and masks")
    g.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "adam-l2"],
                   help="adam: Adam with decoupled weight decay (AdamW), as Megatron-LM's adam; adamw: the "
                        "same; adam-l2: weight decay as an L2 penalty in the gradient (torch.optim.Adam, "
                        "the BERT-like ablation M0)")
    g.add_argument("--lr", type=float, default=6e-4)
    g.add_argument("--min-lr", type=float, default=None)
    g.add_argument("--lr-warmup-init", type=float, default=0.0, help="the learning rate the warmup starts from")
    g.add_argument("--lr-warmup-iters", type=int, default=2000)
    g.add_argument("--lr-warmup-samples", type=int, default=None, help="with --train-samples")
    g.add_argument("--lr-warmup-fraction", type=float, default=None,
                   help="warmup over this fraction of the decay steps (instead of --lr-warmup-iters/-samples)")
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--lr-decay-samples", type=int, default=None, help="with --train-samples")
    g.add_argument("--lr-decay-style", default="cosine", choices=["cosine", "linear", "constant"])
    g.add_argument("--override-opt-param-scheduler", action="store_true",
                   help="take the schedule from the flags, not from the loaded checkpoint")
    g.add_argument("--use-checkpoint-opt-param-scheduler", action="store_true",
                   help="the schedule of the loaded checkpoint wins over the flags: always so here unless "
                        "--override-opt-param-scheduler")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--adam-beta1", type=float, default=0.9, help="Adam's first-moment decay")
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8, help="Adam's epsilon")
    g.add_argument("--clip-grad", type=float, default=1.0, help="clip the global gradient norm to this (0: no clipping)")


def _add_data_args(g) -> None:
    g.add_argument("--data-path", nargs="+", default=None,
                   help="prefixes of .bin/.idx datasets, or weight-prefix pairs (0.2 A 0.4 B 0.4 C)")
    g.add_argument("--data-args-path", default=None,
                   help="a file holding what --data-path would (many prefixes and weights)")
    g.add_argument("--per-split-data-args-path", default=None,
                   help='JSON {"train": ..., "valid": ..., "test": ...}, each like --data-path '
                        "(--split is then unused)")
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-data-path", nargs="*", default=None,
                       help=f"prefixes (or weight-prefix pairs) of the {split} split only; "
                            "replaces --data-path and --split")
    g.add_argument("--mock-data", action="store_true",
                   help="synthetic deterministic documents, packed and masked as real ones: no files")
    g.add_argument("--split", default="949,50,1")
    g.add_argument("--data-cache-path", default=None,
                   help="folder of the datasets' layout caches (default: cache/ beside each dataset)")
    g.add_argument("--seq-length", type=int, default=1024)
    add_tokenizer_flags(g)
    g.add_argument("--legacy-tokenizer", action="store_true",
                   help="accepted: the BertWordPiece tokenizers here give Megatron-LM's legacy tokenizers' ids")
    g.add_argument("--mask-rate", type=float, default=0.2, help="fraction of tokens masked for the MLM loss")
    g.add_argument("--mask-prob", type=float, default=None, help="Megatron-LM's name of --mask-rate")
    g.add_argument("--mask-scheme", default="mask", choices=["mask", "80/10/10"],
                   help="mask: every chosen token becomes [MASK]; 80/10/10: BERT's mask/random/keep")
    g.add_argument("--short-seq-prob", type=float, default=0.0,
                   help="0 only: documents are packed whole up to --seq-length, never cut short on purpose")
    g.add_argument("--packed", action=argparse.BooleanOptionalAction, default=True,
                   help="pack documents with per-document attention (cu_seqlens), or pad")
    g.add_argument("--data-loader", default="torch", choices=["torch", "dali"], help="PyTorch DataLoader or NVIDIA DALI")
    g.add_argument("--dataloader-type", default="single", choices=["single", "cyclic", "external"],
                   help="single only: one pass over the dataset's own shuffled sample order, resumable by "
                        "consumed samples")
    g.add_argument("--num-workers", type=int, default=2, help="data-loader worker processes per rank")


def _add_checkpoint_args(g) -> None:
    g.add_argument("--save", default=None, help="checkpoint root to save to")
    g.add_argument("--load", default=None, help="checkpoint root to resume from (its latest complete iteration)")
    g.add_argument("--save-interval", type=int, default=None,
                   help="save every this many iterations (also at the end and when stopping early)")
    g.add_argument("--keep-last-n-checkpoints", type=int, default=None,
                   help="delete all but the newest N iteration folders after each save")
    g.add_argument("--ckpt-step", type=int, default=None,
                   help="load this iteration of --load instead of the one its marker names")
    g.add_argument("--use-checkpoint-args", action="store_true",
                   help="take the model's shape (preset, sizes, sequence length) from the --load checkpoint")
    g.add_argument("--finetune", action="store_true",
                   help="load the model only; iteration, data position, optimizer and schedule start at 0")
    g.add_argument("--pretrained-checkpoint", default=None,
                   help="when --load holds no checkpoint: start from this one's weights, as --finetune")
    g.add_argument("--no-load-optim", action="store_true",
                   help="load the model (and schedule position), start with a fresh optimizer state")
    g.add_argument("--no-load-rng", action="store_true", help="do not restore the RNG states of the checkpoint")
    g.add_argument("--no-save-optim", action="store_true", help="save checkpoints without the optimizer state")
    g.add_argument("--no-save-rng", action="store_true",
                   help="save checkpoints without the RNG states (a resume from them starts new streams)")
    g.add_argument("--async-save", action="store_true",
                   help="write checkpoints in the background (megatron-core's asynchronous torch_dist save): "
                        "the tensors are staged in host memory, training goes on while a process per rank "
                        "writes them, and the marker moves once every rank's files are written and checksummed")
    g.add_argument("--ckpt-format", default="torch_dist",
                   help="checkpoint format; torch_dist (megatron-core distributed checkpoint) only")
    g.add_argument("--auto-detect-ckpt-format", action="store_true",
                   help="accepted: checkpoints are read as torch_dist, and another format is refused by name")
    g.add_argument("--ckpt-fully-parallel-save", action="store_true",
                   help="accepted: data-parallel ranks always share the writing")
    g.add_argument("--dist-ckpt-strictness", default="assume_ok_unexpected", choices=STRICTNESS,
                   help="what a load does with keys the checkpoint and the model do not share "
                        "(megatron-core's StrictHandling)")
    g.add_argument("--no-verify-checkpoint", action="store_true",
                   help="load without checking the files against the checkpoint's checksums")
    g.add_argument("--break-save-lock", action="store_true",
                   help="take over --save's lock held by a process on another host (when it is known dead)")
    g.add_argument("--overwrite-save", action="store_true",
                   help="start in a --save that holds another run's checkpoints, deleting them")


def _add_fault_args(g) -> None:
    """Pre-emption, hangs, and steps that go non-finite."""
    g.add_argument("--exit-signal-handler", action="store_true",
                   help="on --exit-signal save a checkpoint and exit cleanly")
    g.add_argument("--exit-signal", default="SIGTERM", choices=list(EXIT_SIGNALS),
                   help="the signal --exit-signal-handler answers (as Megatron-LM)")
    g.add_argument("--exit-interval", type=int, default=None, help="save and exit at this iteration")
    g.add_argument("--exit-duration-in-mins", type=float, default=None,
                   help="save and exit once the run has lasted this long (all ranks stop at the same step)")
    g.add_argument("--distributed-timeout-minutes", type=float, default=10,
                   help="timeout of collectives; a watchdog line names the step after half of it")
    g.add_argument("--max-skipped-iters", type=int, default=10,
                   help="stop after this many consecutive steps skipped for a non-finite loss or gradient")


def _add_evaluation_args(g) -> None:
    g.add_argument("--eval-interval", type=int, default=1000, help="iterations between validations (0: none)")
    g.add_argument("--eval-iters", type=int, default=100, help="global batches per validation")
    g.add_argument("--skip-train", action="store_true",
                   help="load, run one validation of --eval-iters batches, and exit without training")


def _add_logging_args(g) -> None:
    g.add_argument("--log-interval", type=int, default=100, help="iterations per console and TensorBoard line")
    g.add_argument("--log-throughput", action="store_true",
                   help="TFLOP/s per GPU on the console ('throughput per GPU (TFLOP/s/GPU)') and, with "
                        "--log-timers-to-tensorboard, as 'throughput' on TensorBoard / wandb")
    g.add_argument("--log-params-norm", action="store_true", help="the parameters' L2 norm on the console "
                   "and TensorBoard ('params-norm')")
    g.add_argument("--log-num-zeros-in-grad", action="store_true",
                   help="the count of zero gradient entries on the console and TensorBoard ('num-zeros')")
    g.add_argument("--timing-log-level", type=int, default=0, choices=[0, 1, 2],
                   help="0 only: Megatron-LM's per-phase timers are not implemented (--profile traces the steps)")
    g.add_argument("--tensorboard-dir", default=None, help="write TensorBoard events here (rank 0)")
    g.add_argument("--tensorboard-log-interval", type=int, default=1,
                   help="iterations between TensorBoard / wandb writes of the per-step figures")
    g.add_argument("--log-timers-to-tensorboard", action="store_true",
                   help="'iteration-time' (and 'throughput' with --log-throughput) on TensorBoard / wandb")
    g.add_argument("--log-validation-ppl-to-tensorboard", action="store_true",
                   help="'lm loss validation ppl' on TensorBoard / wandb")
    g.add_argument("--log-memory-to-tensorboard", action="store_true",
                   help="'mem-reserved-bytes', 'mem-allocated-bytes', 'mem-max-allocated-bytes', "
                        "'mem-allocated-count' (CUDA's allocator; GPU only)")
    g.add_argument("--log-world-size-to-tensorboard", action="store_true", help="'world-size' on TensorBoard / wandb")
    g.add_argument("--no-log-loss-scale-to-tensorboard", action="store_false", dest="log_loss_scale_to_tensorboard",
                   help="no 'loss-scale' on TensorBoard / wandb (written every step by default, 1.0 without --fp16)")
    g.add_argument("--wandb-project", default="", help="log to Weights & Biases (WANDB_MODE=offline works)")
    g.add_argument("--wandb-exp-name", default="", help="the run's name; required with --wandb-project")
    g.add_argument("--wandb-save-dir", default="", help="default: --save/wandb")


def _add_profiling_args(g) -> None:
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


def parse_command_line(argv: Optional[List[str]] = None) -> Tuple[argparse.Namespace, Set[str]]:
    """(the flags' values, with the --config file's under the command line's; the flags the user gave)."""
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    config_keys = _apply_config_file(parser, first.config) if first.config else []
    return parser.parse_args(argv), explicit_dests(build_parser, argv, config_keys)


def parse_settings(argv: Optional[List[str]] = None) -> Settings:
    """The run's settings from its command line, checked."""
    return settings_from_args(*parse_command_line(argv))
