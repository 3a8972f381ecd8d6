"""The straggler rule (`training/resilience/guards/`: rules.py judges, straggler.py measures) on two gloo ranks of the
tiny model: a rank slowed from outside is named within a stated number of windows with its host and since when, and
its recovery said, at a long log interval and a short one (windows of 8 steps); an undisturbed run, a one-step
hiccup, a burst over 3 steps at --log-interval 1 and slow saves name no straggler; --straggler-exit-intervals ends
the slow host's part of the job with its line, the others stopping with a checkpoint; a store gone with a killed
torchrun ends the rank with the launcher watch's line; Megatron-LM's --log-straggler report."""

import re
import subprocess
import sys

import pytest

from megatron_neobert.errors import InputError
from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.training.reporting.goodput import GoodputAccount
from megatron_neobert.training.resilience.guards.rules import MIN_WINDOW_STEPS, RankTime, StragglerRule, slowest
from megatron_neobert.training.resilience.guards.straggler import minmax_report
from pretrain_cases import run_train_with_a_slow_rank, tiny_argv

# 8 steps an interval: each interval is one of the rule's windows (rules.StragglerRule).
LOG_INTERVAL, INTERVALS = 8, 3  # --straggler-intervals' default
DELAY_S = 0.2  # twice a tiny step or more: the slow rank's compute time is well above 1.2x the other's
WARNING = re.compile(r"warning: straggler: rank 1 on host slow-host computes [\d.]+ ms a step, ([\d.]+)x the median "
                     r"of the other ranks, since iteration (\d+): the job's steps take (\d+)% longer than without it")


def argv(data, *extra):
    return tiny_argv(data[0], data[1], "--log-interval", str(LOG_INTERVAL), *extra)


def at_iteration(lines: list, pattern) -> list:
    """(the iteration of the log line before it, the match) of each line matching `pattern`."""
    found, iteration = [], 0
    for line in lines:
        logged = re.search(r"iteration +(\d+)/", line)
        iteration = int(logged.group(1)) if logged else iteration
        if re.search(pattern, line):
            found.append((iteration, re.search(pattern, line)))
    return found


def test_a_slow_rank_is_named_within_its_intervals_and_its_recovery_said(data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    began, ended = 9, 32  # rank 1 slow in iterations 9..32 (the first iteration of an interval)
    ranks = run_on_ranks(run_train_with_a_slow_rank, 2, argv(data, "--train-iters", "48", "--tensorboard-dir",
                                                             str(tmp_path)), 1, range(began, ended + 1), DELAY_S)
    lines = ranks[0][1]
    (named_at, warning), = at_iteration(lines, WARNING)
    since = int(warning.group(2))
    assert float(warning.group(1)) >= 1.2 and int(warning.group(3)) > 0
    # Named once the third slow interval is judged: at the end of the interval after it (the exchange's lag), so at
    # 40 for a slowdown from 9. A busy machine may have slowed rank 0 in an interval too, starting the count again (a
    # later `since`), never an earlier one; the last slow interval is judged at ended + LOG_INTERVAL.
    assert began <= since and named_at == since - 1 + (INTERVALS + 1) * LOG_INTERVAL <= ended + LOG_INTERVAL
    (recovered_at, _), = at_iteration(lines, rf"straggler recovered: host slow-host .* slow from iteration {since}")
    assert ended < recovered_at <= ended + 2 * LOG_INTERVAL
    assert ranks[0][0]["goodput"]["seconds"]["straggler"] > 0
    assert not any("straggler" in line for line in ranks[1][1])  # rank 0 alone reports
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    slowest_rank = {e.step: e.value for e in events.Scalars("slowest-rank")}
    counted = range(since + LOG_INTERVAL - 1, since + INTERVALS * LOG_INTERVAL, LOG_INTERVAL)  # their last iterations
    assert [slowest_rank[it] for it in counted] == [1] * INTERVALS
    low, median, high = ([e.value for e in events.Scalars(f"rank-time-{name}")] for name in ("min", "median", "max"))
    assert all(a <= b <= c for a, b, c in zip(low, median, high)) and len(low) == len(slowest_rank)


@pytest.mark.parametrize("case", ["undisturbed", "slow saves and a hiccup"])
def test_an_undisturbed_run_slow_saves_and_a_hiccup_name_no_straggler(case, data, tmp_path):
    # Long enough for INTERVALS judged intervals (the first is start-up, the last is never judged) besides the one a
    # save pauses. Slow saves: at 24 and at the end, each 1 s longer on rank 1's host; and rank 1's step 19 (in a
    # judged interval) stalls 1 s.
    iterations = (INTERVALS + 3) * LOG_INTERVAL
    disturbed = dict(slow_steps=range(19, 20), delay_s=1.0, save_delay_s=1.0) if case != "undisturbed" else \
        dict(slow_steps=range(0), delay_s=0.0)
    saves = ["--save", str(tmp_path / "ckpt"), "--save-interval", "24"] if disturbed["delay_s"] else []
    ranks = run_on_ranks(run_train_with_a_slow_rank, 2, argv(data, "--train-iters", str(iterations), *saves), 1,
                         **disturbed)
    assert ranks[0][0]["iteration"] == iterations
    assert not [line for line in ranks[0][1] if "straggler" in line]
    assert ranks[0][0]["goodput"]["seconds"]["straggler"] == 0


def test_the_exit_flag_ends_the_slow_hosts_part_naming_it(data, tmp_path):
    save, began, iterations = tmp_path / "ckpt", 9, 64
    ranks = run_on_ranks(run_train_with_a_slow_rank, 2, argv(
        data, "--train-iters", str(iterations), "--straggler-exit-intervals", str(INTERVALS), "--save", str(save)),
        1, range(began, iterations + 1), DELAY_S)
    (first, lines), (slow_error, _) = ranks
    ended = first["iteration"]
    # The rule's earliest: the exit is decided when the --straggler-exit-intervals'th slow interval (9..32; the first,
    # 1..8, is start-up, not judged) is judged, at the end of the interval after it (the exchange's lag: 40), with the
    # warning, and every rank learns it at the next end (48). A busy machine may delay it (an interval in which rank
    # 0 was slow too starts the count again), never bring it forward; slow to the run's end, the host must be ended
    # before it.
    assert first["exit"] == "straggler" and ended % LOG_INTERVAL == 0
    assert began - 1 + (INTERVALS + 2) * LOG_INTERVAL <= ended < iterations
    (warned_at, _), = at_iteration(lines, WARNING)
    assert warned_at == ended - LOG_INTERVAL
    assert slow_error == (f"this host (slow-host) is the straggler, slow for {INTERVALS} judged windows in a row "
                          f"(--straggler-exit-intervals): its part of the job ends at iteration {ended}; drain host "
                          f"slow-host")
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == str(ended)
    assert any(line.startswith(f"host slow-host ended its part of the job as the straggler at iteration {ended}")
               for line in lines)
    assert first["goodput"]["drained_hosts"] == ["slow-host"]


@pytest.mark.parametrize("log_interval", [1, 2])
def test_short_log_intervals_are_judged_in_windows_of_8_steps(log_interval):
    """A burst of a second on one rank over 3 short intervals (a busy machine) is one slow window, not a straggler;
    a rank slow for 3 windows of 8 steps is named, its window starting where the slowness began."""
    rule = StragglerRule(1.2, INTERVALS, None)

    def run(slow: range, last: int) -> list:
        lines = []
        for first in range(1, last + 1, log_interval):
            slow_s = 0.1 + (0.3 if first in slow else 0.0)  # the job's step is the slow rank's
            lines += rule.interval(first, first + log_interval - 1, slow_s,
                                   [RankTime(0, "a", 0.1), RankTime(1, "b", slow_s)]).lines
        return lines

    assert run(range(17, 23), 48) == []  # 3-6 slow steps in a row, within one window
    lines = run(range(49, 49 + INTERVALS * MIN_WINDOW_STEPS), 48 + INTERVALS * MIN_WINDOW_STEPS)
    assert lines == ["warning: straggler: rank 1 on host b computes 400.0 ms a step, 4.00x the median of the other "
                     "ranks, since iteration 49: the job's steps take 300% longer than without it"]


@pytest.mark.parametrize("case", ["a burst at --log-interval 1", "slowed at --log-interval 2"])
def test_at_a_short_log_interval_a_burst_names_no_straggler_and_a_slow_rank_is_named(case, data):
    # Rank 1's steps began..ended are slow. At --log-interval 1 the windows after the start-up interval are 2-9,
    # 10-17, 18-25, ...; at 2, 3-10, 11-18, ...
    burst = case.startswith("a burst")
    log_interval, began, ended, delay_s = (1, 20, 22, 0.35) if burst else (2, 11, 34, DELAY_S)
    iterations = 40 if burst else 56
    ranks = run_on_ranks(run_train_with_a_slow_rank, 2, tiny_argv(
        data[0], data[1], "--log-interval", str(log_interval), "--train-iters", str(iterations)), 1,
        range(began, ended + 1), delay_s)
    lines = ranks[0][1]
    if burst:  # a second's burst, undisturbed otherwise
        assert not [line for line in lines if "straggler" in line]
        assert ranks[0][0]["goodput"]["seconds"]["straggler"] == 0
        return
    (named_at, warning), = at_iteration(lines, WARNING)
    since = int(warning.group(2))
    # Named once its third slow window (11-18, 19-26, 27-34) is judged, at the end of the interval after it (36); a
    # busy machine may start the count again (a later `since`), never an earlier one.
    assert began <= since and named_at == since - 1 + INTERVALS * MIN_WINDOW_STEPS + log_interval <= ended + 2
    (recovered_at, _), = at_iteration(lines, rf"straggler recovered: host slow-host .* slow from iteration {since}")
    # Its recovery said when the first window after it is judged (44), or, on a busy machine that slowed it in that
    # window too, the next (52).
    assert ended < recovered_at <= ended + 2 * MIN_WINDOW_STEPS + log_interval


def test_megatron_lm_report_names_the_min_and_max_ranks():
    times = [RankTime(0, "a", 0.1), RankTime(1, "b", 0.4), RankTime(2, "a", 0.2)]
    worst, ratio = slowest(times)
    assert worst.rank == 1 and ratio == pytest.approx(0.4 / 0.15)
    line, bottom, top = minmax_report(times, 2e12, 2)
    assert line == " MnRtt/Rnk: 100.00ms/0 | MxRtt/Rnk: 400.00ms/1 | MnEtpt/Rnk: 5.00TF/1 | MxEtpt/Rnk: 20.00TF/0"
    assert bottom == "^^^^ Bottom 2 Ranks with lowest  Etpt(TF): 5.00/1, 10.00/2"
    assert top == "^^^^ Top    2 Ranks with highest Etpt(TF): 20.00/0, 10.00/2"


def test_megatron_lm_straggler_flags_keep_its_defaults_and_the_detector_is_on(data):
    settings = parse_settings(argv(data))
    assert (settings.logging.log_straggler, settings.logging.straggler_minmax_count,
            settings.logging.disable_straggler_on_startup) == (False, 1, False)
    assert settings.faults.straggler_detection and settings.faults.straggler_exit_intervals is None


@pytest.mark.parametrize("flags, refused", [
    (["--straggler-threshold", "1"], "--straggler-threshold 1.0 must be above 1"),
    (["--straggler-intervals", "0"], "--straggler-intervals must be at least 1"),
    (["--straggler-exit-intervals", "2"], "--straggler-exit-intervals 2 must be at least --straggler-intervals 3"),
    (["--straggler-minmax-count", "0"], "--straggler-minmax-count must be at least 1")])
def test_straggler_settings_out_of_range_are_refused(data, flags, refused):
    with pytest.raises(InputError, match=re.escape(refused)):
        parse_settings(argv(data, *flags))


def test_the_straggler_time_and_the_drained_hosts_go_on_with_the_jobs_account():
    first = GoodputAccount(1000.0)
    first.straggler_s, first.drained_hosts = 30.0, ["slow-host"]
    resumed = GoodputAccount(1200.0)
    resumed.continue_from(first.snapshot(1100.0, saving=False), saved_until=None, saved_iteration=10)
    resumed.straggler_s += 5.0
    final = resumed.snapshot(1300.0, saving=False)
    assert final["seconds"]["straggler"] == 35.0 and final["drained_hosts"] == ["slow-host"]
    assert "waiting for a straggler (within the steps)" in resumed.table(1300.0)
    assert "drained: slow-host" in resumed.table(1300.0)


TORCHRUN_THAT_DIES = """
import logging, multiprocessing, os, sys, time, types
import torch
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.training.resilience.guards.launcher import LauncherWatch
from megatron_neobert.training.resilience.guards.straggler import StragglerDetector

def rank(port):
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    os.environ["TORCHELASTIC_RUN_ID"] = "a-run"
    watch = LauncherWatch(thread=False)  # no watching thread: the store's failure must end it
    launcher = os.getppid()
    torch.distributed.init_process_group("gloo", rank=0, world_size=1,
                                         store=torch.distributed.TCPStore("127.0.0.1", port, is_master=False))
    settings = parse_settings(["--mock-data", "--train-iters", "10", "--lr-warmup-iters", "0"])
    straggler = StragglerDetector(settings, types.SimpleNamespace(finalize_model_grads_func=None), None, None,
                                  watch)
    straggler.interval_end(1, 4, 1.0, 0.0)
    os.kill(launcher, 9)
    while os.getppid() == launcher:
        time.sleep(0.01)
    straggler.interval_end(5, 8, 1.0, 0.0)
    print("the interval ended", flush=True)

# torchrun: it holds the store, its rank is its child
store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
multiprocessing.get_context("fork").Process(target=rank, args=(store.port,)).start()
time.sleep(600)
"""


@pytest.mark.integration
def test_a_store_gone_with_torchrun_ends_the_rank_with_the_launcher_watchs_line():
    """kill -9 of torchrun, which holds the store: the rank's next interval end meets a broken pipe, and ends the
    rank as the launcher watch would, not in a traceback."""
    torchrun = subprocess.Popen([sys.executable, "-c", TORCHRUN_THAT_DIES], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    output, _ = torchrun.communicate(timeout=300)  # until the rank, which shares its output, is gone too
    assert torchrun.returncode == -9
    assert f"torchrun (pid {torchrun.pid}) is gone; exiting without saving" in output, output
    assert "Traceback" not in output and "the interval ended" not in output, output
