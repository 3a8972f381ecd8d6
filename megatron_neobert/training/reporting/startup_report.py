"""The lines a run prints as it starts: the parallel layout, what it took from the recipe rather than from the user,
how the model differs from its preset or checkpoint, the precision, and what a --load folder held."""

import os
from typing import List, Optional

import torch
from megatron.core import parallel_state

from megatron_neobert.data.tokenizer import NULL_TOKENIZER, build_tokenizer
from megatron_neobert.model import ModelShape
from megatron_neobert.training.config.resolve import recipe_defaults_applied
from megatron_neobert.training.config.schedule import describe_rampup, describe_schedule
from megatron_neobert.training.config.settings import RECIPE_DIFFERENCES, Settings


def describe_layout(settings: Settings, shape: ModelShape, num_chunks: int, num_micro: int) -> str:
    parallel = settings.parallel
    tp, pp = parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size
    dp = parallel_state.get_data_parallel_world_size()
    arch = shape.arch
    on_off = lambda flag: "on" if flag else "off"
    return (f"layout: {torch.distributed.get_world_size()} ranks = TP {tp} x PP {pp} x DP {dp}"
            f" (virtual stages per rank {num_chunks}, sequence parallel {on_off(parallel.sequence_parallel)}, "
            f"distributed optimizer {on_off(parallel.use_distributed_optimizer)}); global batch "
            f"{settings.training.global_batch_size} = micro-batch {settings.training.micro_batch_size} x "
            f"{num_micro} accumulation x DP {dp}; model {shape.preset or 'of the checkpoint'} {arch.num_layers} x "
            f"{arch.hidden_size}, vocab {arch.vocab_size} (padded {shape.padded_vocab_size})")


def describe_folder(folder: Optional[str]) -> str:
    """What a --load folder holds, in words, for the line that says the run starts from scratch."""
    if not folder or not os.path.isdir(folder):
        return "the folder does not exist"
    return "empty" if not os.listdir(folder) else "no checkpoint marker in it"


def startup_notes(settings: Settings, shape: ModelShape) -> List[str]:
    """What the run took from the recipe rather than from the user, and how the model differs from
    its preset: printed at start-up, so that neither happens silently."""
    notes = [f"NeoBERT where Megatron-LM's BERT differs: {'; '.join(RECIPE_DIFFERENCES)}"]
    applied = recipe_defaults_applied(settings)
    if applied:
        notes.append("NeoBERT recipe defaults applied (not set on the command line or in --config): "
                     + "; ".join(applied))
    notes.append(describe_schedule(settings.training))
    if settings.training.rampup_batch_size is not None:
        notes.append(describe_rampup(settings.training))
    if settings.data.tokenizer_type == NULL_TOKENIZER:
        notes.append(build_tokenizer(NULL_TOKENIZER, settings.data.tokenizer_model).describe())
    if settings.data.mock_data and "split" in settings.explicit:
        notes.append(f"--split {settings.data.split} does not apply to --mock-data: megatron-core splits mock data "
                     f"1,1,1")
    if settings.from_checkpoint:
        values = settings.as_dict()
        notes.append("from the args of the checkpoint the run starts from: " + ", ".join(
            f"--{name.replace('_', '-')} {values[name]}" for name in sorted(settings.from_checkpoint)
            if values[name] is not None))
    if settings.checkpoint.use_checkpoint_args:
        notes.append(f"model shape from the checkpoint's args (--use-checkpoint-args): {shape.arch}")
    if shape.changes:
        notes.append(f"{shape.base} overridden: {', '.join(shape.changes)} (the model is not the "
                     f"{'checkpoint' if settings.checkpoint.use_checkpoint_args else 'preset'}'s)")
    if "sequence_parallel" in settings.explicit and settings.parallel.tensor_model_parallel_size == 1:
        notes.append("warning: disabling sequence parallelism because tensor model parallelism is disabled "
                     "(--tensor-model-parallel-size 1)")
    notes.append(precision_note(settings, torch.cuda.is_available()))
    return notes


def precision_note(settings: Settings, on_gpu: bool) -> str:
    """What precision the step runs in, on this device. On a CPU, --bf16 is not ignored: megatron-core's
    Float16Module holds bf16 weights and the linear layers, attention and norms compute in bf16 there too."""
    precision = settings.precision
    if not (precision.bf16 or precision.fp16):
        why = "--no-bf16" if "bf16" in settings.explicit else "the default without a GPU; --bf16 runs bf16 here too"
        return f"precision: fp32 weights, activations, gradients and optimizer state ({why})"
    half = "bf16" if precision.bf16 else "fp16"
    where = "" if on_gpu else ", on the CPU as on a GPU"
    scaling = ("" if precision.bf16 else f"; loss scale {precision.loss_scale:g}" if precision.loss_scale
               else f"; dynamic loss scale from {precision.initial_loss_scale:g}")
    fp8 = (f"FP8 ({precision.fp8_format}, {precision.fp8_recipe} recipe) matrix multiplications in Transformer "
           f"Engine's layers, else " if precision.fp8_format else "")
    return (f"precision: {fp8}{half} weights and activations (linear layers, attention and norms compute in {half}"
            f"{where}); fp32 main weights, gradient reduction and optimizer state (--{half}{scaling})")
