"""The model's shape for a run, decided in one place: the preset (or, with --use-checkpoint-args, the checkpoint's
own record), the size flags, the tokenizer and a loaded checkpoint -> `ModelShape`; and what stops a shape from
being split over a parallel layout (`parallel_shape_problems`), which the trainer's checks and the converter ask
before any rank builds a model."""

import dataclasses
import math
from typing import List, Mapping, Optional, Tuple

from megatron_neobert.model.config import NeoBERTArch, get_arch, swiglu_width

# Megatron-LM's --make-vocab-size-divisible-by: embedding rows a multiple of this x TP (tensor-core friendly shards).
VOCAB_PADDING_MULTIPLE = 128
# Transformer Engine's FP8 GEMMs take operands whose last dimension is a multiple of 16 (transformer_engine.pytorch.
# utils.assert_dim_for_fp8_exec; cuBLASLt's FP8 kernels need 16-byte rows): every width of a layer's linears on a
# tensor-parallel rank, as the forward's inner dimension or the backward's.
FP8_WIDTH_MULTIPLE = 16
TP_SIZES = (1, 2, 4, 8)  # the tensor-parallel sizes suggested: within one 8-GPU node


def padded_vocab_size(vocab_size: int, tensor_model_parallel_size: int = 1,
                      make_vocab_size_divisible_by: int = VOCAB_PADDING_MULTIPLE) -> int:
    """Megatron-LM's rule: pad the vocabulary to a multiple of divisible_by x TP."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-vocab_size // multiple) * multiple


def derived_ffn_hidden_size(activation: str, hidden_size: int) -> int:
    """The MLP width for --hidden-size without --ffn-hidden-size, by the presets' own rule (SwiGLU: 2/3 x 4h rounded
    up to 8, as NeoBERT; Megatron-LM rounds down to 64; GELU: 4h)."""
    return swiglu_width(4 * hidden_size) if activation == "swiglu" else 4 * hidden_size


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the run builds and records.

    `padded_vocab_size`: rows of the embedding and output layer (a loaded checkpoint's own: its rows are fixed);
    `preset`: the preset named (with --use-checkpoint-args the one the checkpoint's args record: None for a shape that
    is not a preset's); `base`: what the shape started from, in words; `changes`: 'field base -> this run (why)' for
    each size where the model is not the base's;
    `hf_intermediate_size`: the nominal SwiGLU size a Hugging Face source gave for this width, kept so that the
    export says what the source said (several nominal sizes map to one width: 512 and 516 both to 344)."""

    arch: NeoBERTArch
    padded_vocab_size: int
    preset: Optional[str]
    base: str
    changes: Tuple[str, ...] = ()
    hf_intermediate_size: Optional[int] = None


def resolve_model_shape(preset: str, overrides: Mapping[str, int], *, tokenizer_vocab_size: Optional[int] = None,
                        seq_length: Optional[int] = None, tensor_model_parallel_size: int = 1,
                        make_vocab_size_divisible_by: int = VOCAB_PADDING_MULTIPLE,
                        checkpoint_args: Optional[dict] = None, use_checkpoint_args: bool = False) -> ModelShape:
    """The run's shape.

    The base is the preset, or with `use_checkpoint_args` the checkpoint's arch record (the preset is a name for a
    shape, never required). `overrides` (NeoBERTArch field -> value, the size flags given) win over the base, as
    Megatron-LM's command line over load_args_from_checkpoint. The vocabulary is the tokenizer's unless given (the
    checkpoint's with `use_checkpoint_args`). With RoPE, `max_sequence_length` becomes the longest length the model
    has been trained at: this run's `seq_length`, the loaded checkpoint's record, or (from scratch) the preset's;
    a loaded checkpoint's length replaces the preset's, which it was never trained at. A loaded checkpoint
    (`checkpoint_args`) fixes the vocabulary rows."""
    saved = checkpoint_args or {}
    saved_arch = saved.get("arch")
    if use_checkpoint_args:
        base, base_name, name = NeoBERTArch(**saved_arch), "the checkpoint's shape", saved.get("model_preset")
    else:
        base, base_name, name = get_arch(preset), f"model preset {preset}", preset
    fields = dict(overrides)
    why = {}
    if "vocab_size" not in fields and tokenizer_vocab_size is not None and not use_checkpoint_args:
        fields["vocab_size"], why["vocab_size"] = tokenizer_vocab_size, "the tokenizer's"
    if "hidden_size" in fields and "ffn_hidden_size" not in fields:
        fields["ffn_hidden_size"] = derived_ffn_hidden_size(base.activation, fields["hidden_size"])
        why["ffn_hidden_size"] = "derived from --hidden-size"
    arch = dataclasses.replace(base, **fields)
    if arch.position_embedding_type == "rope":
        loaded = saved_arch["max_sequence_length"] if saved_arch else 0
        start = fields.get("max_sequence_length") or loaded or base.max_sequence_length
        arch = dataclasses.replace(arch, max_sequence_length=max(start, seq_length or 0, loaded))
        if arch.max_sequence_length != base.max_sequence_length and "max_sequence_length" not in fields:
            why["max_sequence_length"] = ("--seq-length" if arch.max_sequence_length == seq_length
                                          else "the length the loaded checkpoint was trained at")
    changes = tuple(f"{f.name} {getattr(base, f.name)} -> {getattr(arch, f.name)}"
                    + (f" ({why[f.name]})" if f.name in why else "")
                    for f in dataclasses.fields(arch) if getattr(base, f.name) != getattr(arch, f.name))
    rows = saved.get("padded_vocab_size") or padded_vocab_size(arch.vocab_size, tensor_model_parallel_size,
                                                                make_vocab_size_divisible_by)
    same_width = saved_arch is not None and saved_arch.get("ffn_hidden_size") == arch.ffn_hidden_size
    return ModelShape(arch, rows, name, base_name, changes, saved.get("hf_intermediate_size") if same_width else None)


def _one_of(values) -> str:
    values = [str(v) for v in values]
    return ", ".join(values[:-1]) + " or " + values[-1] if len(values) > 1 else values[0]


def _nearest_multiples(value: int, step: int) -> str:
    below, above = value // step * step, -(-value // step) * step
    return _one_of([below, above] if below else [above])


def _nearest_divisors(number: int, value: int) -> str:
    """The divisors of `number` nearest to `value`, below and above it."""
    below = max(d for d in range(1, min(value, number) + 1) if number % d == 0)
    above = [d for d in range(value + 1, number + 1) if number % d == 0][:1]
    return _one_of([below, *above])


def _tensor_parallel_rules(arch: NeoBERTArch, tp: int, fp8: bool) -> List[tuple]:
    """(flag, its value, what is wrong, the step of its valid values or None, an FP8 rule) of each rule `arch`
    breaks at tensor-parallel size `tp`, in the order megatron-core and Transformer Engine would meet them."""
    heads, ffn = arch.num_attention_heads, arch.ffn_hidden_size
    attention = heads * arch.kv_channels  # the QKV GEMM's output is 3 x this; linear_proj's input is this
    rules = [(heads % tp, "--num-attention-heads", heads, f"each rank computes whole heads, and {tp} does not divide "
              f"{heads}", None, False),
             (ffn % tp, "--ffn-hidden-size", ffn, f"each rank holds an equal share of the MLP, and {tp} does not "
              f"divide {ffn}", tp, False)]
    if fp8:
        rules += [(attention // tp % FP8_WIDTH_MULTIPLE, "--hidden-size", arch.hidden_size,
                   f"the attention width per rank, {attention // tp} (the QKV output {3 * attention // tp}), is not "
                   f"a multiple of {FP8_WIDTH_MULTIPLE}", math.lcm(FP8_WIDTH_MULTIPLE * tp, heads), True),
                  (ffn // tp % FP8_WIDTH_MULTIPLE, "--ffn-hidden-size", ffn, f"the MLP width per rank, {ffn // tp}, is "
                   f"not a multiple of {FP8_WIDTH_MULTIPLE}", FP8_WIDTH_MULTIPLE * tp, True)]
    return [rule[1:] for rule in rules if rule[0]]


def _tensor_parallel_problem(arch: NeoBERTArch, source: str, tp: int, fp8: bool, resizable: bool) -> Optional[str]:
    """The first rule `arch` breaks at tensor-parallel size `tp`, with the values that mend it: the sizes that fit
    every rule."""
    problems = _tensor_parallel_rules(arch, tp, fp8)
    if not problems:
        return None
    flag, value, why, step, fp8_rule = problems[0]
    # The sizes that fit; where none does with FP8 and the rule broken is not FP8's, those that fit without it
    # (the FP8 check then names what else to change).
    sizes = [size for size in TP_SIZES if not _tensor_parallel_rules(arch, size, fp8)]
    if not sizes and not fp8_rule:
        sizes = [size for size in TP_SIZES if not _tensor_parallel_rules(arch, size, False)]
    fixes = ([f"{flag} {_nearest_multiples(value, step)}"] if step and resizable else []) + (
        [f"--tensor-model-parallel-size {_one_of(sizes)}"] if sizes else [])
    if fp8_rule:
        fixes.append("drop --fp8-format")
    head, tail = ("--fp8-format: ", " (Transformer Engine's FP8 GEMMs)") if fp8_rule else ("", "")
    return (f"{head}{flag} {value} ({source}) at --tensor-model-parallel-size {tp}: {why}{tail}"
            + (f"; use {', or '.join(fixes)}" if fixes else ""))


def parallel_shape_problems(arch: NeoBERTArch, source: str, tensor_model_parallel_size: int = 1,
                            pipeline_model_parallel_size: int = 1,
                            num_layers_per_virtual_pipeline_stage: Optional[int] = None, fp8: bool = False,
                            resizable: bool = True) -> List[str]:
    """Why `arch` cannot be split over this parallel layout, one line per problem naming the flag, where the shape
    came from (`source`, in words) and the nearest values that fit: the tensor-parallel split (with `fp8`: in
    Transformer Engine's FP8 GEMMs), the pipeline stages' layers, the virtual stages' layers. [] when it can be.
    `resizable`: the model's sizes are flags that can change (the trainer's), so sizes that fit are suggested too;
    a model converted as it is can change only its layout. megatron-core would stop in the build (or, for virtual
    stages that do not divide a stage's layers, build another split), Transformer Engine in the first FP8 GEMM."""
    problems = []
    tensor_parallel = _tensor_parallel_problem(arch, source, tensor_model_parallel_size, fp8, resizable)
    if tensor_parallel:
        problems.append(tensor_parallel)
    layers, pp, per_virtual = arch.num_layers, pipeline_model_parallel_size, num_layers_per_virtual_pipeline_stage
    if layers % pp:
        fixes = ([f"--num-layers {_nearest_multiples(layers, pp)}"] if resizable else []) + [
            f"--pipeline-model-parallel-size {_nearest_divisors(layers, pp)}"]
        problems.append(f"--num-layers {layers} ({source}) at --pipeline-model-parallel-size {pp}: each stage holds "
                        f"an equal share of the layers, and {pp} does not divide {layers}; use {', or '.join(fixes)}")
    if per_virtual and pp == 1:
        problems.append(f"--num-layers-per-virtual-pipeline-stage {per_virtual} at --pipeline-model-parallel-size 1: "
                        f"virtual stages interleave the stages of a pipeline, and there is one; use "
                        f"--pipeline-model-parallel-size 2 or more, or drop --num-layers-per-virtual-pipeline-stage")
    elif per_virtual and not layers % pp and layers // pp % per_virtual:
        per_stage = layers // pp
        problems.append(f"--num-layers-per-virtual-pipeline-stage {per_virtual} ({source}: {layers} layers, "
                        f"{per_stage} a stage at --pipeline-model-parallel-size {pp}): each stage's layers split into "
                        f"virtual stages of equal size, and {per_virtual} does not divide {per_stage}; use "
                        f"--num-layers-per-virtual-pipeline-stage {_nearest_divisors(per_stage, per_virtual)}")
    return problems
