"""The learning-rate schedules of recent encoder recipes with Megatron-LM's flags and megatron-core's meanings: WSD
(warmup-stable-decay, each of its final decays) and inverse-square-root give, step by step, the learning rate of
the OptimizerParamScheduler Megatron-LM's get_optimizer_param_scheduler builds from the same flags; a WSD run stopped
in its stable phase goes on with a longer --train-iters as if planned so from the start; a resume in the decay is
exact."""

import pytest

from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.training.config.arguments import parse_settings
from pretrain_cases import run_train, tiny_argv
from test_megatron_compat import _lrs

GBS = 16


def megatron_lm_lrs(args: dict, batch_sizes: list) -> list:
    """The learning rate of each iteration under megatron-core's OptimizerParamScheduler, built as Megatron-LM's
    get_optimizer_param_scheduler (training.py, core_v0.16.1) builds it from its args (its defaults where `args` has
    none; --global-batch-size GBS), stepped by each iteration's global batch (`batch_sizes`) as its train_step
    steps it."""
    import torch
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    a = {**dict(train_iters=None, train_samples=None, lr_decay_iters=None, lr_decay_samples=None, lr_warmup_iters=0,
                lr_warmup_samples=0, lr_warmup_fraction=None, lr_wsd_decay_iters=None, lr_wsd_decay_samples=None,
                lr_wsd_decay_style="exponential", lr_warmup_init=0.0, min_lr=0.0, weight_decay=0.01), **args}
    if a["train_iters"]:
        lr_decay_steps = (a["lr_decay_iters"] or a["train_iters"]) * GBS
        wd_incr_steps = a["train_iters"] * GBS
        wsd_decay_steps = None if a["lr_wsd_decay_iters"] is None else a["lr_wsd_decay_iters"] * GBS
        lr_warmup_steps = a["lr_warmup_iters"] * GBS
    else:
        lr_decay_steps = a["lr_decay_samples"] or a["train_samples"]
        wd_incr_steps = a["train_samples"]
        wsd_decay_steps = a["lr_wsd_decay_samples"]
        lr_warmup_steps = a["lr_warmup_samples"]
    if a["lr_warmup_fraction"] is not None:
        lr_warmup_steps = a["lr_warmup_fraction"] * lr_decay_steps
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=a["lr_warmup_init"], max_lr=a["lr"], min_lr=a["min_lr"], lr_warmup_steps=lr_warmup_steps,
        lr_decay_steps=lr_decay_steps, lr_decay_style=a["lr_decay_style"], start_wd=a["weight_decay"],
        end_wd=a["weight_decay"], wd_incr_steps=wd_incr_steps, wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=False,
        wsd_decay_steps=wsd_decay_steps, lr_wsd_decay_style=a["lr_wsd_decay_style"])
    lrs = []
    for batch in batch_sizes:
        lrs.append(optimizer.param_groups[0]["lr"])
        scheduler.step(increment=batch)
    return lrs


def _argv(args: dict) -> list:
    return ["--mock-data", "--global-batch-size", str(GBS)] + [
        item for name, value in args.items() for item in (f"--{name.replace('_', '-')}", str(value))]


COMMON = dict(lr=1e-3, min_lr=1e-5, lr_warmup_init=1e-6)
CASES = {
    **{f"WSD {style}": dict(COMMON, train_iters=100, lr_warmup_iters=10, lr_decay_iters=90, lr_decay_style="WSD",
                            lr_wsd_decay_style=style, lr_wsd_decay_iters=30)
       for style in ("exponential", "linear", "cosine", "minus_sqrt")},
    "WSD minus_sqrt, samples, decay to the end": dict(COMMON, train_samples=1600, lr_warmup_samples=160,
                                                     lr_decay_style="WSD", lr_wsd_decay_style="minus_sqrt",
                                                     lr_wsd_decay_samples=480),
    "WSD, warmup fraction, decay to the end": dict(COMMON, train_iters=100, lr_warmup_fraction=0.05,
                                                   lr_decay_style="WSD", lr_wsd_decay_iters=20),
    "inverse-square-root": dict(COMMON, train_iters=100, lr_warmup_iters=10, lr_decay_style="inverse-square-root"),
    "inverse-square-root, samples": dict(COMMON, train_samples=1600, lr_warmup_samples=160, lr_decay_samples=1280,
                                         lr_decay_style="inverse-square-root"),
}
SHOWN = (0, 5, 10, 40, 59, 60, 61, 70, 80, 89, 90, 95, 99)


@pytest.mark.parametrize("case", CASES)
def test_learning_rate_is_megatron_cores_at_every_step(case):
    ours, theirs = _lrs(_argv(CASES[case]), 100), megatron_lm_lrs(CASES[case], [GBS] * 100)
    print(f"\n{case}\n  step  this trainer   megatron-core")
    for step in SHOWN:
        print(f"  {step:4d}  {ours[step]:.9e}  {theirs[step]:.9e}")
    assert ours == theirs
    assert ours[10] == pytest.approx(1e-3) and min(ours) >= 1e-6 and ours[-1] < 1e-3


def test_wsd_and_inverse_square_root_decay_to_the_end_of_the_run_by_default():
    """The recipe's 90% decay belongs to its cosine: WSD and inverse-square-root end theirs with the run, as
    Megatron-LM's, and the start-up report lists no recipe default for them."""
    from megatron_neobert.training.config.resolve import recipe_defaults_applied

    for style, extra in (("WSD", ["--lr-wsd-decay-iters", "10"]), ("inverse-square-root", [])):
        settings = parse_settings(["--mock-data", "--train-iters", "100", "--lr-warmup-iters", "5",
                                   "--lr-decay-style", style, *extra])
        assert settings.training.lr_decay_iters == 100
        assert not any(item.startswith("--lr-decay-iters") for item in recipe_defaults_applied(settings))
    cosine = parse_settings(["--mock-data", "--train-iters", "100", "--lr-warmup-iters", "5"])
    assert cosine.training.lr_decay_iters == 90


@pytest.mark.parametrize("flags, message", [
    (["--lr-decay-style", "WSD"], "--lr-decay-style WSD needs --lr-wsd-decay-iters: the length of its final decay"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "96"],
     "--lr-wsd-decay-iters 96 must be at least 1 and at most the decay steps after the warmup: --lr-decay-iters 100 "
     "- warmup 5 = 95"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "0"], "--lr-wsd-decay-iters 0 must be at least 1"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "32"],
     "--lr-wsd-decay-samples goes with --train-samples; with --train-iters use --lr-wsd-decay-iters"),
    (["--lr-wsd-decay-iters", "10"], "--lr-wsd-decay-iters: only with --lr-decay-style WSD"),
])
def test_wsd_lengths_that_cannot_be_are_refused_in_one_line(flags, message):
    with pytest.raises(ValueError) as err:
        parse_settings(["--mock-data", "--train-iters", "100", "--lr-warmup-iters", "5", *flags])
    assert message in str(err.value) and "\n" not in str(err.value)


WSD = ["--lr-decay-style", "WSD", "--lr-wsd-decay-style", "minus_sqrt", "--lr-wsd-decay-iters", "4"]


def _run(data, *extra):
    return run_on_ranks(run_train, 1, tiny_argv(data[0], data[1], *WSD, *extra))[0]


@pytest.fixture(scope="module")
def planned(data, tmp_path_factory):
    """(history, checkpoint root) of the WSD run planned for 12 iterations: stable after its 2 warmup steps until
    iteration 9, its decay in iterations 10-12; saved at 9 and 12."""
    save = str(tmp_path_factory.mktemp("planned") / "ckpt")
    return _run(data, "--train-iters", "12", "--save", save, "--save-interval", "9"), save


def _records(history, *fields):
    return [tuple(r[f] for f in fields) for r in history["train"]]


@pytest.mark.integration
def test_wsd_stopped_in_its_stable_phase_goes_on_longer_without_a_jump(planned, data, tmp_path):
    """Planned for 8 iterations, stopped at 4 (stable); resumed with --train-iters 12 and
    --override-opt-param-scheduler (the flags' schedule from the checkpoint's position, as Megatron-LM): the lrs and
    losses of the run planned for 12 from the start, exactly."""
    history, _ = planned
    save = str(tmp_path / "ckpt")
    stopped = _run(data, "--train-iters", "8", "--exit-interval", "4", "--save", save)
    went_on = _run(data, "--train-iters", "12", "--load", save, "--override-opt-param-scheduler")
    around = _records(stopped, "iteration", "lr", "loss")[-2:] + _records(went_on, "iteration", "lr", "loss")[:2]
    print("\niteration, lr, loss around the resume:", *around, sep="\n  ")
    print("planned for 12:", *_records(history, "iteration", "lr", "loss")[2:6], sep="\n  ")
    assert stopped["iteration"] == 4 and stopped["exit"] == "exit-interval"
    assert [r["iteration"] for r in went_on["train"]] == list(range(5, 13))
    assert _records(stopped, "lr", "loss") == _records(history, "lr", "loss")[:4]
    assert _records(went_on, "lr", "loss") == _records(history, "lr", "loss")[4:]
    assert [lr for _, lr, _ in around] == [3e-3] * 4  # the stable phase goes on at --lr


@pytest.mark.parametrize("override", [False, True])
def test_a_resume_says_when_the_checkpoints_schedule_is_not_the_flags(override):
    """As the trainer resumes: the scheduler of the flags (--train-iters 12) loads the state of one saved under
    --train-iters 8; megatron-core keeps the checkpoint's decay unless --override-opt-param-scheduler, and the line
    the trainer prints then says so."""
    import torch

    from megatron_neobert.training.config.schedule import checkpoint_schedule_note
    from megatron_neobert.training.engine.model_setup import build_scheduler

    def scheduler(*flags):
        training = parse_settings(["--mock-data", "--global-batch-size", "8", "--lr-warmup-iters", "2", *WSD,
                                   *flags]).training
        return build_scheduler(training, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0))

    saved = scheduler("--train-iters", "8")
    saved.step(increment=4 * 8)
    resumed = scheduler("--train-iters", "12", *(["--override-opt-param-scheduler"] if override else []))
    flags = resumed.state_dict()
    resumed.load_state_dict(saved.state_dict())
    assert resumed.num_steps == 32 and resumed.lr_decay_steps == (96 if override else 64)
    note = checkpoint_schedule_note(flags, resumed.state_dict())
    assert note == (None if override else "the checkpoint's learning-rate schedule applies, not the flags' (decay "
                    "(samples) 64 there, 96 here): --override-opt-param-scheduler takes the flags', from the "
                    "checkpoint's position")


@pytest.mark.integration
def test_wsd_resumes_exactly_in_its_decay(planned, data):
    history, save = planned
    resumed = _run(data, "--train-iters", "12", "--load", save, "--ckpt-step", "9")
    print("\niteration, lr, loss: planned", *_records(history, "iteration", "lr", "loss")[8:], "resumed at 9",
          *_records(resumed, "iteration", "lr", "loss"), sep="\n  ")
    assert [r["iteration"] for r in resumed["train"]] == [10, 11, 12]
    assert _records(resumed, "lr", "loss") == _records(history, "lr", "loss")[9:]
    lrs = [r["lr"] for r in history["train"]]
    assert lrs[8] == 3e-3 > lrs[9] > lrs[10] > lrs[11] > 3e-4  # iterations 10-12 decay, 1-sqrt
