"""The start-of-run checks on given arguments and a checkpoint's saved args, without a run (the runs that meet
them end to end are in test_bad_input.py and test_faults.py)."""

import argparse
import dataclasses
import re

import pytest

from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.data.tokenizer import build_tokenizer
from megatron_neobert.model import ModelShape, parallel_shape_problems
from megatron_neobert.model.config import PRESETS, NeoBERTArch, get_arch
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.errors import InputError, TrainingError
from megatron_neobert.training.engine.model_setup import run_model_shape
from megatron_neobert.training.config.run_checks import (TENSOR_SHAPE_FIELDS, check_inputs, check_model_shape,
                                                         check_optimizer_setup, check_parallel_shape, check_positions,
                                                         check_tokenizer_matches_checkpoint, check_vocabulary)

TINY = get_arch("neobert-tiny")


def settings_of(*flags):
    data = [] if any(flag.endswith("data-path") for flag in flags) else ["--mock-data"]
    return parse_settings([*data, "--train-iters", "10", "--lr-warmup-iters", "0", *flags])


def saved(arch=TINY, **args):
    """The `common` dict of a checkpoint whose args record `arch`."""
    return {"args": argparse.Namespace(arch=dataclasses.asdict(arch), **args)}


@pytest.mark.parametrize("prefix, made_by", [
    ("corpora/wiki_content_document", "--output-prefix corpora/wiki --json-keys content"),
    ("corpora/wiki", "--output-prefix corpora/wiki --json-keys text"),  # not a preprocess_data.py name
])
def test_a_missing_dataset_is_named_with_the_command_that_makes_it(prefix, made_by):
    settings = settings_of("--data-path", prefix, "--tokenizer-model", SAMPLE_TOKENIZER)
    with pytest.raises(InputError, match=f"dataset {prefix} not found") as err:
        check_inputs(settings.data)
    assert made_by in str(err.value) and f"--tokenizer-model {SAMPLE_TOKENIZER}" in str(err.value)


def test_every_split_of_per_split_paths_is_checked(data):
    prefix = data[0]
    settings = settings_of("--train-data-path", prefix, "--valid-data-path", prefix, "--test-data-path", "nowhere/test",
                   "--tokenizer-model", SAMPLE_TOKENIZER)
    with pytest.raises(InputError, match="dataset nowhere/test not found"):
        check_inputs(settings.data)
    good = settings_of("--data-path", prefix, "--tokenizer-model", SAMPLE_TOKENIZER)
    assert check_inputs(good.data).vocab_size == 8192


def test_a_tokenizer_larger_than_the_vocabulary_is_refused():
    tokenizer = build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER)
    check_vocabulary(tokenizer, TINY)  # 8192 entries, 8192 rows
    with pytest.raises(InputError, match="has 8,192 entries, more than the model's vocabulary of 8,191: raise "
                                         "--vocab-size to at least 8192"):
        check_vocabulary(tokenizer, dataclasses.replace(TINY, vocab_size=8191))


def test_a_tokenizer_of_another_vocabulary_than_the_checkpoints_is_refused():
    tokenizer = build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER)  # 8192 entries
    check_tokenizer_matches_checkpoint(tokenizer, "ckpt", saved(tokenizer_vocab_size=8192))
    check_tokenizer_matches_checkpoint(tokenizer, "ckpt", saved())  # an older checkpoint records none
    with pytest.raises(InputError, match="has 8,192 entries, the tokenizer of checkpoint ckpt 30,522 "
                                         "\\(bert-base-uncased\\): give the checkpoint's tokenizer"):
        check_tokenizer_matches_checkpoint(tokenizer, "ckpt", saved(tokenizer_vocab_size=30522,
                                                                    tokenizer_model="bert-base-uncased"))


def shape_of(arch, base="model preset neobert-tiny") -> ModelShape:
    return ModelShape(arch, arch.vocab_size, None, base)


def test_a_checkpoint_of_another_shape_names_every_difference():
    check_model_shape(shape_of(TINY), "ckpt", saved())
    other = dataclasses.replace(TINY, num_layers=2, activation="gelu")
    with pytest.raises(InputError) as err:
        check_model_shape(shape_of(other), "ckpt", saved())
    assert str(err.value).startswith("checkpoint ckpt holds a model of another shape (num_layers 4 there, 2 here; "
                                     "activation swiglu there, gelu here; this run: model preset neobert-tiny")
    # Where the shape came from, as resolve_model_shape says: with --use-checkpoint-args, the checkpoint.
    with pytest.raises(InputError, match="; this run: the checkpoint's shape and its overrides\\)"):
        check_model_shape(shape_of(other, "the checkpoint's shape"), "ckpt", saved())
    # The vocabulary rows and the RoPE length are not the shape; a checkpoint without our args is megatron-core's.
    check_model_shape(shape_of(dataclasses.replace(TINY, vocab_size=9000, max_sequence_length=64)), "ckpt", saved())
    check_model_shape(shape_of(other), "ckpt", {"args": argparse.Namespace()})


def test_learned_positions_are_part_of_the_shape():
    m0 = get_arch("ablation-m0")
    with pytest.raises(InputError, match=f"max_sequence_length {m0.max_sequence_length} there, 64 here"):
        check_model_shape(shape_of(dataclasses.replace(m0, max_sequence_length=64)), "ckpt", saved(m0))


def test_rope_records_the_longest_length_trained_at():
    def length(*flags, common=None):
        settings = settings_of("--model-preset", "neobert-tiny", *flags)
        return run_model_shape(settings, common=common).arch.max_sequence_length

    assert length("--max-position-embeddings", "32", "--seq-length", "16") == 32
    assert length("--max-position-embeddings", "32", "--seq-length", "64") == 64
    # A checkpoint trained longer keeps its length; the preset's (1024), never trained at, does not replace it.
    assert length("--seq-length", "16", common=saved(dataclasses.replace(TINY, max_sequence_length=128))) == 128
    assert length("--seq-length", "16", common=saved(dataclasses.replace(TINY, max_sequence_length=512))) == 512
    assert length("--seq-length", "16") == 1024


def test_learned_positions_bound_the_sequence_length():
    m0 = dataclasses.replace(get_arch("ablation-m0"), max_sequence_length=32)
    check_positions(settings_of("--seq-length", "32"), m0)
    with pytest.raises(TrainingError, match="--seq-length 64 is longer than the 32 learned positions of the model "
                                            "\\(learned_absolute\\)"):
        check_positions(settings_of("--model-preset", "ablation-m0", "--seq-length", "64"), m0)


def test_an_optimizer_state_of_another_setup_names_each_setting_and_the_way_out():
    check_optimizer_setup(settings_of("--bf16"), "ckpt", saved(bf16=True, use_distributed_optimizer=False))
    with pytest.raises(TrainingError) as err:
        check_optimizer_setup(settings_of("--use-distributed-optimizer"), "ckpt",
                              saved(bf16=True, use_distributed_optimizer=False))
    assert str(err.value).startswith("checkpoint ckpt holds optimizer state of another setup (--bf16 on there, off "
                                     "here; --use-distributed-optimizer off there, on here); start with a fresh "
                                     "optimizer state with --no-load-optim")


def test_a_one_iteration_run_gets_a_scheduler_that_decays_over_it():
    """90% of one iteration rounds to none, which megatron-core's scheduler refuses: the default is at least 1."""
    import torch

    from megatron_neobert.training.engine.model_setup import build_scheduler
    training = parse_settings(["--mock-data", "--train-iters", "1", "--lr-warmup-iters", "0"]).training
    assert training.lr_decay_iters == 1
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=training.lr)
    scheduler = build_scheduler(training, optimizer)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(training.lr)
    scheduler.step(training.global_batch_size)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(training.min_lr)


# The flag named by the refusal of each preset at TP 1, 2, 4 and 8, without and with FP8 (None: it runs).
# Without FP8 only TP 8 is refused: it splits no preset's heads (12, or neobert-tiny's 4) evenly. With FP8,
# neobert-tiny's MLP width 344 is no multiple of 16 at any TP, and ablation-m7's attention width 1056 is not
# at TP 4 (264 per rank).
HEADS, FFN, HIDDEN = "--num-attention-heads", "--fp8-format: --ffn-hidden-size", "--fp8-format: --hidden-size"
REFUSALS = {False: {tp: {preset: HEADS if tp == 8 else None for preset in PRESETS} for tp in (1, 2, 4, 8)},
            True: {1: dict.fromkeys(PRESETS, None) | {"neobert-tiny": FFN},
                   2: dict.fromkeys(PRESETS, None) | {"neobert-tiny": FFN},
                   4: dict.fromkeys(PRESETS, None) | {"neobert-tiny": FFN, "ablation-m7": HIDDEN},
                   8: dict.fromkeys(PRESETS, HEADS)}}


def tensor_parallel_problem(arch, tp, fp8, preset):
    """The one line of `arch`'s problems at TP `tp` (PP 1): its tensor-parallel split's, or None."""
    problems = parallel_shape_problems(arch, f"model preset {preset}", tp, fp8=fp8)
    assert len(problems) <= 1, problems
    return problems[0] if problems else None


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_at_tp_1_2_4_8_is_refused_before_the_build_naming_the_flag_and_valid_values(preset, tp, fp8):
    arch = get_arch(preset)
    error = tensor_parallel_problem(arch, tp, fp8, preset)
    expected = REFUSALS[fp8][tp][preset]
    if expected is None:
        assert error is None
        return
    assert error.startswith(f"{expected} ") and f" (model preset {preset}) at --tensor-model-parallel-size {tp}: " \
        in error, error
    # Each value it suggests mends the rule it names: the run passes, or is refused for another rule.
    suggestions = re.findall(r"(--[a-z-]+) (\d+(?:, \d+)*(?: or \d+)?)", error.split("; use ", 1)[1])
    assert suggestions, error
    for flag, values in suggestions:
        for value in map(int, re.split(", | or ", values)):
            if flag == "--tensor-model-parallel-size":
                again = tensor_parallel_problem(arch, value, fp8, preset)
            else:
                field = {"--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size"}[flag]
                again = tensor_parallel_problem(dataclasses.replace(arch, **{field: value}), tp, fp8, preset)
            assert again is None or not again.startswith(expected), (error, flag, value, again)


def test_the_fp8_refusals_name_the_width_on_a_rank():
    assert tensor_parallel_problem(get_arch("neobert-tiny"), 1, True, "neobert-tiny") == (
        "--fp8-format: --ffn-hidden-size 344 (model preset neobert-tiny) at --tensor-model-parallel-size 1: the "
        "MLP width per rank, 344, is not a multiple of 16 (Transformer Engine's FP8 GEMMs); use --ffn-hidden-size "
        "336 or 352, or drop --fp8-format")
    assert tensor_parallel_problem(get_arch("ablation-m7"), 4, True, "ablation-m7") == (
        "--fp8-format: --hidden-size 1056 (model preset ablation-m7) at --tensor-model-parallel-size 4: the "
        "attention width per rank, 264 (the QKV output 792), is not a multiple of 16 (Transformer Engine's FP8 "
        "GEMMs); use --hidden-size 960 or 1152, or --tensor-model-parallel-size 1 or 2, or drop --fp8-format")


def parallel_shape_error(*flags) -> str:
    """What check_parallel_shape says of neobert-250m (28 layers, 12 heads) with `flags`, '' when it passes."""
    settings = settings_of("--model-preset", "neobert-250m", *flags)
    try:
        check_parallel_shape(settings, run_model_shape(settings))
    except InputError as err:
        return str(err)
    return ""


def test_a_runs_shape_is_checked_against_its_tp_size_as_an_input_error():
    assert parallel_shape_error("--tensor-model-parallel-size", "4") == ""
    assert parallel_shape_error("--tensor-model-parallel-size", "8").startswith(
        "--num-attention-heads 12 (model preset neobert-250m) at --tensor-model-parallel-size 8: ")


def test_28_layers_at_pipeline_size_3_are_refused_naming_the_sizes_that_divide():
    assert parallel_shape_error("--pipeline-model-parallel-size", "3") == (
        "--num-layers 28 (model preset neobert-250m) at --pipeline-model-parallel-size 3: each stage holds an equal "
        "share of the layers, and 3 does not divide 28; use --num-layers 27 or 30, or --pipeline-model-parallel-size "
        "2 or 4")
    for pp in ("2", "4", "7"):
        assert parallel_shape_error("--pipeline-model-parallel-size", pp) == ""
    assert parallel_shape_error("--pipeline-model-parallel-size", "3", "--num-layers", "30") == ""


def test_virtual_stages_that_do_not_divide_a_stages_layers_are_refused():
    assert parallel_shape_error("--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage",
                                "2") == (
        "--num-layers-per-virtual-pipeline-stage 2 (model preset neobert-250m: 28 layers, 7 a stage at "
        "--pipeline-model-parallel-size 4): each stage's layers split into virtual stages of equal size, and 2 does "
        "not divide 7; use --num-layers-per-virtual-pipeline-stage 1 or 7")
    assert parallel_shape_error("--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                                "7") == ""  # 14 a stage: 2 virtual stages of 7
    assert parallel_shape_error("--num-layers-per-virtual-pipeline-stage", "7") == (
        "--num-layers-per-virtual-pipeline-stage 7 at --pipeline-model-parallel-size 1: virtual stages interleave the "
        "stages of a pipeline, and there is one; use --pipeline-model-parallel-size 2 or more, or drop "
        "--num-layers-per-virtual-pipeline-stage")


def test_the_converter_is_offered_layouts_only():
    """A model converted as it is keeps its sizes: only the parallel sizes that fit are suggested."""
    assert parallel_shape_problems(get_arch("neobert-250m"), "the model in f", 8, 3, resizable=False) == [
        "--num-attention-heads 12 (the model in f) at --tensor-model-parallel-size 8: each rank computes whole heads, "
        "and 8 does not divide 12; use --tensor-model-parallel-size 1, 2 or 4",
        "--num-layers 28 (the model in f) at --pipeline-model-parallel-size 3: each stage holds an equal share of the "
        "layers, and 3 does not divide 28; use --pipeline-model-parallel-size 2 or 4"]


def test_every_architecture_field_is_checked_against_a_checkpoint_or_said_not_to_decide_the_tensors():
    """A field added to NeoBERTArch fails here until it joins TENSOR_SHAPE_FIELDS (a checkpoint of another value is
    refused by name) or the fields that decide no tensor, or that another check reads."""
    checked_apart = {"vocab_size",  # check_vocabulary_rows: the padded rows, not the value
                     "max_sequence_length"}  # a tensor with learned positions alone (check_model_shape adds it)
    no_tensor = {"norm_epsilon", "rotary_base", "init_range"}  # values in the computation, not in the weights
    assert {f.name for f in dataclasses.fields(NeoBERTArch)} == set(TENSOR_SHAPE_FIELDS) | checked_apart | no_tensor
