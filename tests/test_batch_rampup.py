"""Megatron-LM's `--rampup-batch-size START INCREMENT SAMPLES` on megatron-core's micro-batch calculator: the global
batch grows in steps as Megatron-LM's does, and the iterations, the data, the consumed samples, the schedule (in
samples), the log line's `global batch size` and the checkpoints follow it; a resume in the ramp is exact; batch
sizes that micro-batch x data-parallel size does not divide are refused before training."""

import json
import os
import re

import pytest

from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.training.config.arguments import parse_settings
from pretrain_cases import run_train, run_train_logged, tiny_argv
from test_lr_schedules import megatron_lm_lrs
from test_train_log import ITERATION, VALIDATION

# 4, 8, 12, then 16 samples per step: one increment every 48 / 3 = 16 samples; Megatron-LM's update_train_iters
# counts 8 steps while the samples before them are within the ramp (4+4+4+4+8+8+12+12 = 56), then (160 - 56) // 16.
RAMP = ["--global-batch-size", "16", "--train-samples", "160", "--rampup-batch-size", "4", "4", "48",
        "--lr-warmup-samples", "16", "--lr-decay-samples", "144", "--log-interval", "1"]
SIZES = [4, 4, 4, 4, 8, 8, 12, 12, 16, 16, 16, 16, 16, 16]


def _argv(data, *extra):
    argv = tiny_argv(data[0], data[1], *RAMP, *extra)
    at = argv.index("--lr-warmup-iters")  # the schedule is in samples
    return argv[:at] + argv[at + 2:]


@pytest.fixture(scope="module")
def ramped(data, tmp_path_factory):
    """(history, log lines, checkpoint root) of the ramped run on one rank, saved at 6 (mid-ramp) and 12."""
    save = str(tmp_path_factory.mktemp("ramped") / "ckpt")
    history, lines = run_on_ranks(run_train_logged, 1, _argv(data, "--save", save, "--save-interval", "6"))[0]
    return history, lines, save


def test_the_modernbert_style_example_parses():
    """examples/modernbert_style.yaml: WSD with a 1-sqrt decay over the last 50B tokens, the batch growing from 768
    to 4,608 over the first 50B, in samples of 1,024 tokens; its ramp divides into 32 x 8 micro-batches."""
    import os

    from megatron_neobert.training.config.batch_size import check_batch_sizes
    from megatron_neobert.training.config.schedule import describe_rampup, describe_schedule

    example = os.path.join(os.path.dirname(__file__), "..", "examples", "modernbert_style.yaml")
    training = parse_settings(["--config", example]).training
    assert (training.lr_decay_style, training.lr_wsd_decay_style) == ("WSD", "minus_sqrt")
    assert training.rampup_batch_size == [768, 768, 48828125] and training.lr_decay_samples == training.train_samples
    check_batch_sizes(training, 8)
    print(describe_schedule(training), describe_rampup(training), sep="\n")
    ramp_steps = 48828125 // 768  # at most: the batch is 768 only at first
    assert 1660156250 // 4608 < training.train_iters < 1660156250 // 4608 + ramp_steps


def test_the_ramp_gives_the_sizes_megatron_core_0_16_gave_sample_for_sample():
    """megatron-core 0.18 replaced the ramp's calculator by a step schedule: the schedule the compat module derives
    gives, on every release, the sizes 0.16.1's RampupBatchsizeNumMicroBatchesCalculator gave (recorded from it:
    60 random ramps, 2,548 consumed-sample counts around each step, over ramps of 2 to 10^11 samples)."""
    from megatron_neobert.megatron_core_compat import micro_batch_calculator

    with open(os.path.join(os.path.dirname(__file__), "data", "ramp_sizes_megatron_core_0.16.1.json")) as f:
        cases = json.load(f)
    for case in cases:
        calculator = micro_batch_calculator(case["global_batch_size"], case["ramp"], 1, 1)
        sizes = []
        for consumed in case["consumed"]:
            calculator.update(consumed, consistency_check=False)
            sizes.append(calculator.get_current_global_batch_size())
        assert sizes == case["sizes"], case["ramp"]


def test_iterations_are_counted_as_megatron_lm_counts_a_ramp():
    settings = parse_settings(["--mock-data", "--micro-batch-size", "2", *RAMP])
    assert settings.training.train_iters == len(SIZES) == 14
    # An increment every 50 / 3 samples: 4 (x5), 8, 8, 12, 12 while the samples before a step are at most 50 (60
    # samples), then (160 - 60) // 16 steps of 16.
    settings = parse_settings(["--mock-data", "--micro-batch-size", "2", *RAMP, "--rampup-batch-size", "4", "4", "50"])
    assert settings.training.train_iters == 9 + 6


@pytest.mark.parametrize("flags, message", [
    (["--train-iters", "10", "--rampup-batch-size", "4", "4", "48"], "--rampup-batch-size needs --train-samples"),
    (["--train-samples", "160", "--rampup-batch-size", "16", "4", "48"],
     "--rampup-batch-size 16 4 48: START must be below --global-batch-size 16"),
    (["--train-samples", "160", "--rampup-batch-size", "4", "5", "48"],
     "--global-batch-size 16 - START 4 must be a multiple of INCREMENT 5"),
    (["--train-samples", "160", "--rampup-batch-size", "4", "0", "48"], "START, INCREMENT and SAMPLES must be at least 1"),
    (["--train-samples", "160", "--rampup-batch-size", "4", "4", "0"], "START, INCREMENT and SAMPLES must be at least 1"),
])
def test_ramps_that_cannot_be_are_refused_in_one_line(flags, message):
    with pytest.raises(ValueError) as err:
        parse_settings(["--mock-data", "--global-batch-size", "16", "--lr-warmup-samples", "0", *flags])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("micro_batch, dp, message", [
    (2, 2, None), (1, 4, None),
    (2, 4, "--rampup-batch-size 4 4 48: global batch size 4 of the ramp (4, 8, 12, 16) is not a multiple of "
           "--micro-batch-size 2 x data-parallel size 4"),
    (4, 3, "global batch size 4 of the ramp (4, 8, 12, 16) is not a multiple of --micro-batch-size 4 x "
           "data-parallel size 3"),
])
def test_ramp_sizes_data_parallelism_does_not_divide_are_refused(micro_batch, dp, message):
    """Each size of the ramp must divide into micro-batches on every data-parallel rank, as megatron-core's
    calculator asserts at the step that reaches it: here, before training."""
    from megatron_neobert.training.config.batch_size import check_batch_sizes

    training = parse_settings(["--mock-data", "--micro-batch-size", str(micro_batch), *RAMP]).training
    if message is None:
        check_batch_sizes(training, dp)
        return
    with pytest.raises(ValueError, match=re.escape(message)):
        check_batch_sizes(training, dp)


def _field(line, name):
    return float(re.search(rf" {name}: +([-+.\dE]+) \|", line).group(1))


@pytest.mark.integration
def test_the_batch_grows_as_megatron_lms_and_everything_follows_it(ramped):
    history, lines, _ = ramped
    records = history["train"]
    iterations = [line for line in lines if ITERATION.match(line)]
    print("", *[line for line in lines if line.startswith(("global batch size:", "ramping up"))], *iterations,
          sep="\n")
    assert [r["global_batch_size"] for r in records] == SIZES and history["iteration"] == 14
    assert [r["consumed_samples"] for r in records] == [sum(SIZES[:i + 1]) for i in range(14)]
    assert records[0]["tokens"] < records[4]["tokens"] < records[6]["tokens"] < records[8]["tokens"]  # more samples
    assert [int(_field(line, "global batch size")) for line in iterations] == SIZES
    assert [int(_field(line, "consumed samples")) for line in iterations] == [r["consumed_samples"] for r in records]
    assert [line for line in lines if line.startswith("ramping up")] == [
        f"ramping up batch size from {a} to {b}" for a, b in ((4, 8), (8, 12), (12, 16))]
    assert ("global batch size: 4, growing by 4 every 16 samples, 16 after sample 48 (--rampup-batch-size); 14 "
            "iterations in --train-samples 160") in lines
    # The schedule counts samples: the lr of each step is megatron-core's scheduler's stepped by its batch.
    expected = megatron_lm_lrs(dict(lr=3e-3, min_lr=0.1 * 3e-3, train_samples=160, lr_warmup_samples=16,
                                    lr_decay_samples=144, lr_decay_style="cosine"), SIZES)
    assert [r["lr"] for r in records] == expected
    assert not history["eval"] and not any(VALIDATION.match(line) for line in lines)


@pytest.mark.integration
def test_a_resume_in_the_ramp_is_exact(ramped, data):
    history, _, save = ramped
    resumed = run_on_ranks(run_train, 1, _argv(data, "--load", save, "--ckpt-step", "6"))[0]
    fields = ("iteration", "global_batch_size", "consumed_samples", "lr", "loss")
    print("\nplanned:", *[tuple(r[f] for f in fields) for r in history["train"][5:9]], "resumed at 6:",
          *[tuple(r[f] for f in fields) for r in resumed["train"][:3]], sep="\n  ")
    assert [tuple(r[f] for f in fields) for r in resumed["train"]] == [
        tuple(r[f] for f in fields) for r in history["train"][6:]]


@pytest.mark.integration
def test_the_ramp_on_two_data_parallel_ranks_trains_as_on_one(ramped, data):
    """Each step's micro-batches shared out between the data-parallel ranks: the same samples, so the same losses
    as on one rank (up to the order of the gradient reduction)."""
    history, _, _ = ramped
    ranks = run_on_ranks(run_train, 2, _argv(data))
    for rank in ranks:
        assert [r["global_batch_size"] for r in rank["train"]] == SIZES
        assert [r["loss"] for r in rank["train"]] == pytest.approx([r["loss"] for r in history["train"]], rel=1e-5)
