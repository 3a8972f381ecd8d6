"""The trainer on gloo ranks: loss falls, exact resume (also at another layout), gradients
independent of the micro-batch split and data-parallel size, pre-emption, non-finite steps, stage 2.

Every run trains a 2-layer, 64-wide cut of the tiny preset on the built-in sample corpus at
length 64, with the real data pipeline (preprocessing, MLM dataset, resumable loader).
"""

import json
import os
import shutil

import pytest
import torch

from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.checkpoint.layout import iteration_dir, read_latest_iteration, write_latest_marker
from pretrain_cases import (read_weights, real_tokens_per_step, run_train, run_train_until_nonfinite,
                            run_train_with_signal, tiny_argv)
from shared_runs import run_once

pytestmark = pytest.mark.integration

TP2_PP2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
TP2_DP2_DISTOPT = ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer"]
# A vocabulary padded to 8320 rows at TP1 (multiple of 128) but to 8448 at TP2 (of 256), as 30522 is.
VOCAB_8200 = ["--vocab-size", "8200"]
ITERS, SAVE_AT = 12, 6


def argv(data, *extra):
    return tiny_argv(data[0], data[1], *extra)


def one(histories):
    """Every rank reports the same (globally reduced) history; return it."""
    for h in histories[1:]:
        assert [r["loss"] for r in h["train"]] == [r["loss"] for r in histories[0]["train"]]
    return histories[0]


def losses(history, start=0):
    return [r["loss"] for r in history["train"] if r["iteration"] > start]


def saved_run(data, tmp_path_factory, name: str, ranks: int, *layout: str):
    """(history, checkpoint root) of an ITERS-step run saving every SAVE_AT steps; run once per session, its
    checkpoints only read (or copied) by the tests."""
    def run(folder):
        save = str(folder / "ckpt")
        h = one(run_on_ranks(run_train, ranks, argv(data, *layout, "--train-iters", str(ITERS), "--save", save,
                                                    "--save-interval", str(SAVE_AT))))
        return h, save
    return run_once(tmp_path_factory, f"test_pretrain-{name}", run)


@pytest.fixture(scope="module")
def tp2_pp2_run(data, tmp_path_factory):
    return saved_run(data, tmp_path_factory, "tp2pp2", 4, *TP2_PP2)


@pytest.fixture(scope="module")
def distopt_run(data, tmp_path_factory):
    return saved_run(data, tmp_path_factory, "distopt", 4, *TP2_DP2_DISTOPT)


@pytest.fixture(scope="module")
def tp1_run(data, tmp_path_factory):
    return saved_run(data, tmp_path_factory, "tp1", 1, *VOCAB_8200)


def mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.parametrize("run", ["tp2_pp2_run", "distopt_run"])
def test_loss_falls_on_four_ranks(run, request):
    history, save = request.getfixturevalue(run)
    curve = losses(history)
    print(run, [round(x, 3) for x in curve])
    assert len(curve) == ITERS and all(torch.isfinite(torch.tensor(curve)))
    assert mean(curve[-3:]) < mean(curve[:3]) - 0.5, curve
    assert read_latest_iteration(save) == ITERS
    # The schedule the run used: warmup 2 steps from 0, cosine to 10% at 90% of 12 steps (10.8 -> 10).
    lrs = [r["lr"] for r in history["train"]]
    assert lrs[:3] == pytest.approx([0.0, 1.5e-3, 3e-3])
    assert lrs[-1] == pytest.approx(3e-4)


def restart_from(save: str, iteration: int, dst: str) -> str:
    """A checkpoint root holding only `iteration` of `save`: as if the run had stopped there."""
    shutil.copytree(iteration_dir(save, iteration), iteration_dir(dst, iteration))
    write_latest_marker(dst, iteration)
    return dst


@pytest.mark.parametrize("source,layout,ranks,exact", [
    ("tp2_pp2_run", TP2_PP2, 4, True),
    ("tp2_pp2_run", [], 2, False),  # TP2 x PP2 -> DP2
    ("distopt_run", ["--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"], 2, False),
    # TP1 -> TP2 keeps the checkpoint's 8320 vocabulary rows (and their Adam moments)
    ("tp1_run", [*VOCAB_8200, "--tensor-model-parallel-size", "2"], 2, False),
])
def test_resume_gives_the_uninterrupted_losses(source, layout, ranks, exact, request, data, tmp_path):
    reference, save = request.getfixturevalue(source)
    root = restart_from(save, SAVE_AT, str(tmp_path / "ckpt"))
    resumed = one(run_on_ranks(run_train, ranks, argv(data, *layout, "--train-iters", str(ITERS),
                                                      "--load", root)))
    assert [r["iteration"] for r in resumed["train"]] == list(range(SAVE_AT + 1, ITERS + 1))
    expected = losses(reference, SAVE_AT)
    print(source, layout, "reference", expected, "resumed", losses(resumed))
    if exact:
        assert losses(resumed) == expected
        assert [r["lr"] for r in resumed["train"]] == [r["lr"] for r in reference["train"][SAVE_AT:]]
    else:  # other reduction orders
        assert losses(resumed) == pytest.approx(expected, rel=2e-4)


def test_a_run_extended_by_resuming_sees_the_longer_run_samples(data, tmp_path, capfd):
    """Planned for 4 steps, then resumed with --train-iters 8 (same schedule flags): the losses
    of the run planned for 8 steps from the start, exactly (same samples, same masks). The load prints none of the
    FutureWarnings megatron-core's checkpointing raises through torch (a user cannot act on them)."""
    schedule = ["--lr-decay-iters", "8", "--split", "90,10,0"]
    planned = one(run_on_ranks(run_train, 1, argv(data, *schedule, "--train-iters", "8")))
    save = str(tmp_path / "ckpt")
    run_on_ranks(run_train, 1, argv(data, *schedule, "--train-iters", "4", "--save", save))
    capfd.readouterr()
    extended = one(run_on_ranks(run_train, 1, argv(data, *schedule, "--train-iters", "8",
                                                   "--load", save)))
    assert [r["iteration"] for r in extended["train"]] == [5, 6, 7, 8]
    assert losses(extended) == losses(planned, 4)
    assert "FutureWarning" not in capfd.readouterr().err


GRAD_STEP = ["--train-iters", "1", "--lr", "1e6", "--adam-eps", "1e6", "--lr-warmup-iters", "0",
             "--lr-decay-style", "constant", "--lr-decay-iters", "10", "--weight-decay", "0",
             "--clip-grad", "1e12"]


def test_gradients_do_not_depend_on_micro_batches_or_data_parallel_size(data, tmp_path):
    """One step whose update equals the gradient (Adam's first step with eps = lr = 1e6:
    g * eps / (|g| + eps)): equal weights after it mean equal gradients."""
    splits = {"mbs1x8": (1, ["--micro-batch-size", "1"]),
              "mbs4x2": (1, ["--micro-batch-size", "4"]),
              "dp2-mbs2x2-distopt": (2, ["--micro-batch-size", "2", "--use-distributed-optimizer"])}
    records = {name: one(run_on_ranks(run_train, ranks, argv(data, *GRAD_STEP, *extra, "--save",
                                                          str(tmp_path / name))))["train"][0]
               for name, (ranks, extra) in splits.items()}
    weights = run_on_ranks(read_weights, 1, argv(data), [iteration_dir(str(tmp_path / n), 1) for n in splits])[0]
    results = {name: (records[name], w) for name, w in zip(splits, weights)}
    ref_record, ref_weights = results["mbs1x8"]
    print({n: (r["loss"], r["grad_norm"]) for n, (r, _) in results.items()})
    assert ref_record["grad_norm"] > 0
    for name, (record, weights) in results.items():
        assert record["loss"] == pytest.approx(ref_record["loss"], rel=1e-6), name
        assert record["grad_norm"] == pytest.approx(ref_record["grad_norm"], rel=1e-5), name
        for key in ref_weights:
            torch.testing.assert_close(weights[key], ref_weights[key], rtol=1e-5, atol=1e-7,
                                       msg=f"{name}: {key}")


def test_overlapped_gradient_reduction_and_parameter_gathering_change_nothing(data, tmp_path):
    """DP2 with the distributed optimizer, 4 micro-batches per rank and step, buckets of 20k parameters
    (5 buckets instead of 1): reduce-scatters started asynchronously by the backward of the last
    micro-batch, parameter all-gathers waited for in the next forward (forced before evaluating and
    saving) give exactly the losses and weights of the synchronous run, since every gradient element is
    the same sum of two values. Clipping is off: the float32 gradient norm depends on how the buckets
    split parameters between the ranks (~1e-5 relative), which would reach the weights."""
    common = ["--use-distributed-optimizer", "--micro-batch-size", "1", "--train-iters", "4",
              "--eval-interval", "2", "--clip-grad", "0"]
    runs = {"sync": [], "overlap": ["--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "20000"]}
    histories = {name: one(run_on_ranks(run_train, 2, argv(data, *common, *extra, "--save", str(tmp_path / name))))
                 for name, extra in runs.items()}
    assert losses(histories["overlap"]) == losses(histories["sync"])
    assert histories["overlap"]["eval"] == histories["sync"]["eval"] and len(histories["sync"]["eval"]) == 2
    sync, overlap = run_on_ranks(read_weights, 1, argv(data), [iteration_dir(str(tmp_path / n), 4) for n in runs])[0]
    for key in sync:
        assert torch.equal(overlap[key], sync[key]), key


def test_logged_tokens_per_second_count_real_tokens_only(data):
    """Padded batches: the log's tokens are the non-padding ones, counted once over the pipeline."""
    # Length 256: most of the sample corpus's documents end in a chunk shorter than that.
    flags = argv(data, "--no-packed", "--pipeline-model-parallel-size", "2", "--train-iters", "3",
                 "--lr-warmup-iters", "1", "--seq-length", "256")
    history = one(run_on_ranks(run_train, 2, flags))
    expected = run_on_ranks(real_tokens_per_step, 1, flags, 3)[0]
    print("real tokens per step", expected)
    assert [r["tokens"] for r in history["train"]] == expected
    assert sum(expected) < 3 * 8 * 256  # the sample corpus's document tails leave padding


def test_sigterm_saves_a_loadable_checkpoint_and_exits(data, tmp_path):
    save = str(tmp_path / "ckpt")
    # PP2 x 2 virtual stages: interleaved 1F1B runs (exactness is the lead's open VPP issue).
    common = ["--num-layers", "4", "--pipeline-model-parallel-size", "2",
              "--num-layers-per-virtual-pipeline-stage", "1", "--train-iters", "8", "--save", save,
              "--load", save]
    # Only rank 1 is signalled; both ranks must stop at the same step.
    stopped = one(run_on_ranks(run_train_with_signal, 2, argv(data, *common, "--exit-signal-handler"), 1, 3))
    assert stopped["exit"] == "signal" and stopped["iteration"] == 3
    assert all(torch.isfinite(torch.tensor(losses(stopped))))
    assert read_latest_iteration(save) == 3
    resumed = one(run_on_ranks(run_train, 2, argv(data, *common, "--train-iters", "4")))
    assert [r["iteration"] for r in resumed["train"]] == [4]


def test_profile_writes_a_trace_on_the_profiled_rank_only(data, tmp_path, capfd):
    tb = tmp_path / "tb"
    run_on_ranks(run_train, 2, argv(data, "--train-iters", "2", "--lr-warmup-iters", "0", "--profile",
                                    "--profile-step-start", "1",
                                    "--profile-step-end", "2", "--tensorboard-dir", str(tb)))
    traces = sorted(p.name for p in tb.glob("*.pt.trace.json"))
    assert traces == ["rank0_steps2-2.pt.trace.json"]
    names = {e.get("name") for e in json.loads((tb / traces[0]).read_text())["traceEvents"]}
    assert {"aten::mm", "ProfilerStep#0"} <= names, sorted(n for n in names if n)[:40]
    printed = capfd.readouterr().out
    assert printed.count("profile of steps 2-2 on rank") == 1 and "on rank 0" in printed
    assert "Self CPU" in printed and "aten::mm" in printed  # the top operators table


def test_nonfinite_steps_are_skipped_then_stop_the_run(data, tmp_path):
    save = str(tmp_path / "ckpt")
    records, error = run_on_ranks(run_train_until_nonfinite, 1, argv(
        data, "--train-iters", "12", "--save", save, "--save-interval", "2", "--max-skipped-iters", "2"),
        [3, 6, 7, 8])[0]
    by_it = {r["iteration"]: r for r in records}
    assert by_it[3]["skipped"] and not by_it[4]["skipped"] and by_it[5]["skipped"] is False
    # A skipped step leaves the schedule where it was: step 4 uses the lr step 3 would have.
    assert by_it[4]["lr"] == by_it[3]["lr"]
    # Steps 6 and 7 are recorded as skipped; the third in a row (8) stops the run.
    assert [r["iteration"] for r in records] == list(range(1, 8))
    assert by_it[6]["skipped"] and by_it[7]["skipped"]
    assert error is not None and "3 consecutive steps" in error and error.endswith("Last good checkpoint: "
                                                                                    + iteration_dir(save, 4))
    assert read_latest_iteration(save) == 4  # no save after the bad steps at 6
    assert not os.path.exists(iteration_dir(save, 6)) and not os.path.exists(iteration_dir(save, 8))


@pytest.mark.parametrize("with_optimizer", [True, False])
def test_stage2_continues_at_a_longer_length_on_the_length_blend(with_optimizer, distopt_run, data, tmp_path):
    """Stage 2 from a stage-1 checkpoint: length 128 (stage 1: 64), a 0.2 / 0.4 / 0.4 blend of
    all documents / those of 1024+ / 2048+ tokens; with the optimizer state (iterations go on)
    or the weights only (--finetune: iterations restart)."""
    from megatron_neobert.data.preprocessing.length_subset import make_length_subset

    _, stage1 = distopt_run
    full = data[0]
    subsets = {n: str(tmp_path / f"plus{n}") for n in (1024, 2048)}
    for n, prefix in subsets.items():
        make_length_subset(full, prefix, n)
    blend = ["--data-path", "0.2", full, "0.4", subsets[1024], "0.4", subsets[2048]]
    extra = (["--train-iters", str(ITERS + 3)] if with_optimizer
             else ["--finetune", "--train-iters", "3", "--lr-warmup-iters", "1"])
    # The small subsets (71 and 35 documents of the sample corpus at 1024+ / 2048+) get no test split.
    h = one(run_on_ranks(run_train, 1, argv(data, *blend, "--split", "98,2,0", "--seq-length", "128",
                                            "--use-distributed-optimizer",
                                            "--load", stage1, *extra)))
    first = h["train"][0]["iteration"]
    assert first == (ITERS + 1 if with_optimizer else 1) and len(h["train"]) == 3
    curve = losses(h)
    assert all(torch.isfinite(torch.tensor(curve)))
    # The stage-1 weights were loaded: the loss starts well below a fresh model's ~9.0.
    assert curve[0] < 8.6, curve


def test_stage2_takes_its_settings_from_the_stage1_checkpoint(distopt_run, data, tmp_path):
    """examples/pretrain_neobert_stage2.sh's flags (`stage2_plan`): four times stage 1's length with its tokens per
    step, a twentieth of its steps, on its ranks, layout, optimizer setup, tokenizer and data; the run loads stage
    1's optimizer state (refused were the setup another) and goes on from its last iteration."""
    from megatron_neobert.training.config.stage2 import stage2_plan

    _, stage1 = distopt_run
    save = str(tmp_path / "stage2")
    plan = stage2_plan(stage1, save)
    value = lambda flag: plan.flags[plan.flags.index(flag) + 1]  # noqa: E731
    assert plan.ranks == 4 and "--use-checkpoint-args" in plan.flags and "--use-distributed-optimizer" in plan.flags
    assert [value(f) for f in ("--seq-length", "--micro-batch-size", "--global-batch-size", "--train-iters",
                               "--tensor-model-parallel-size", "--load", "--data-path")] == \
        ["256", "1", "2", str(ITERS + 1), "2", stage1, data[0]]  # 8 x 64 tokens per step -> 2 x 256
    h = one(run_on_ranks(run_train, plan.ranks, [*plan.flags, "--data-cache-path", data[1], "--num-workers", "0"]))
    assert [r["iteration"] for r in h["train"]] == [ITERS + 1]
    assert losses(h)[0] < 8.6  # stage 1's weights: a fresh model starts at ~9.0
    assert read_latest_iteration(save) == ITERS + 1
    assert stage2_plan(stage1, save).flags[plan.flags.index("--load") + 1] == save  # a re-run resumes stage 2
