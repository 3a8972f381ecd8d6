"""Precision flags checked against the machine before any model is built.

The environment (this GPU's compute capability, whether Transformer Engine imports) comes in as
parameters, so every rule is testable on a CPU; `None` means: look it up here.
"""

import argparse
from typing import Optional, Tuple, Union

from megatron_neobert.training.errors import InputError

# TE's FP8 GEMMs need every dimension but the last a multiple of 8 and the last of 16; the token
# dimension of an activation is tokens per micro-batch, split over TP with sequence parallelism.
FP8_TOKEN_MULTIPLE = 16
FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: FP8 tensor cores
MXFP8_MIN_CAPABILITY = (10, 0)  # Blackwell: MXFP8 block scaling is done by the tensor cores


def _detect_capability() -> Union[Tuple[int, int], bool]:
    import torch  # here: the trainer's --help must not wait for it

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else False


def _detect_te() -> bool:
    from megatron_neobert.model.layer_specs import transformer_engine_available

    return transformer_engine_available()


def validate_precision_args(args: argparse.Namespace,
                            gpu_capability: Optional[Union[Tuple[int, int], bool]] = None,
                            te_available: Optional[bool] = None) -> argparse.Namespace:
    """Sets `--bf16` when not given (on for a GPU, off on a CPU) and rejects combinations that
    cannot run. `gpu_capability`: (major, minor) of this rank's GPU, False without one."""
    capability = _detect_capability() if gpu_capability is None else gpu_capability
    te = _detect_te() if te_available is None else te_available
    on_gpu = bool(capability)
    if args.bf16 is None:
        args.bf16 = on_gpu and not args.fp16  # the recipe trains in bf16; fp32 (--no-bf16) is for debugging
    if args.attention_backend == "local":  # Megatron-LM's: megatron-core's own layers, no TE kernel
        if args.transformer_impl == "transformer_engine":
            raise InputError("--attention-backend local runs megatron-core's local layers: not with "
                             "--transformer-impl transformer_engine")
        args.transformer_impl = "local"
    uses_te = args.transformer_impl == "transformer_engine" or (
        args.transformer_impl == "auto" and te and on_gpu)
    if args.attention_backend in ("flash", "fused", "unfused") and not uses_te:
        raise InputError(f"--attention-backend {args.attention_backend} picks a Transformer Engine attention kernel, "
                         f"and the layers here are megatron-core's local ones (--transformer-impl "
                         f"{args.transformer_impl}, Transformer Engine {'on a CPU' if te else 'absent'}): use "
                         f"--attention-backend auto or local")
    if args.transformer_impl == "transformer_engine" and not te:
        raise InputError("--transformer-impl transformer_engine: Transformer Engine does not import here")
    if uses_te and args.packed and not (args.bf16 or args.fp16):
        raise InputError("Transformer Engine attention has no fp32 kernel for packed (THD) input: "
                         "pass --bf16 (or --fp16), or --no-packed, or --transformer-impl local")
    if args.fp8_format is None:
        return args
    if not te:
        raise InputError(f"--fp8-format {args.fp8_format} needs Transformer Engine, which does not import "
                         f"here; drop --fp8-format")
    if not uses_te:
        raise InputError(f"--fp8-format {args.fp8_format} runs in Transformer Engine layers: use "
                         f"--transformer-impl transformer_engine (or auto on a GPU), not "
                         f"{args.transformer_impl}")
    if not args.bf16:
        raise InputError(f"--fp8-format {args.fp8_format} needs --bf16 (FP8 GEMMs in bf16 layers)")
    if on_gpu and tuple(capability) < FP8_MIN_CAPABILITY:
        raise InputError(f"--fp8-format {args.fp8_format}: this GPU (compute capability "
                         f"{capability[0]}.{capability[1]}) has no FP8 tensor cores (needs >= 8.9)")
    if args.fp8_recipe == "mxfp8" and on_gpu and tuple(capability) < MXFP8_MIN_CAPABILITY:
        raise InputError(f"--fp8-recipe mxfp8 needs a Blackwell GPU (compute capability >= 10.0), this one "
                         f"is {capability[0]}.{capability[1]}: use --fp8-recipe delayed or tensorwise")
    tokens = args.micro_batch_size * args.seq_length
    tp = args.tensor_model_parallel_size
    per_rank = tokens // tp if args.sequence_parallel else tokens
    if (args.sequence_parallel and tokens % tp) or per_rank % FP8_TOKEN_MULTIPLE:
        split = f" / --tensor-model-parallel-size {tp} (sequence parallel)" if args.sequence_parallel else ""
        raise InputError(f"--fp8-format: tokens per micro-batch (--micro-batch-size {args.micro_batch_size} x "
                         f"--seq-length {args.seq_length}{split} = {tokens / (tp if args.sequence_parallel else 1):g})"
                         f" must be a multiple of {FP8_TOKEN_MULTIPLE}")
    return args
