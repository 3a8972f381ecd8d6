"""The run's account of wall time (training/reporting/goodput.py): continued across resumes and restarts, saved in each
checkpoint, and the save interval `--save-interval auto` chooses from it (training/resilience/save_interval.py)."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from megatron_neobert.checkpoint.state import read_checkpoint
from megatron_neobert.errors import InputError
from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.training.reporting.goodput import (CATEGORIES, GOODPUT_FILE, LAUNCHER_PART, GoodputAccount,
                                                         LaunchersExitCloser, add_launchers_exit, launch_parts,
                                                         write_final_account)
from megatron_neobert.training.resilience.save_interval import SaveInterval
from pretrain_cases import run_train, run_train_with_slow_saves, tiny_argv
from test_faults import RESTARTED, Job, argv


def account_of(attempt_started: float, **seconds_and_counts) -> GoodputAccount:
    account = GoodputAccount(attempt_started)
    for category, (seconds, count) in seconds_and_counts.items():
        account.add(category, seconds, count)
    return account


def test_a_resumed_account_keeps_the_jobs_start_and_puts_the_gap_between_attempts():
    first = account_of(1000.0, startup=(20.0, 1), productive=(50.0, 10), save=(5.0, 1))
    # A blocking save's snapshot is taken as it begins; the save ended 4 s later (its manifest's time).
    snapshot = first.snapshot(1100.0, saving=True)
    resumed = GoodputAccount(1200.0)
    resumed.continue_from(snapshot, saved_until=1104.0, saved_iteration=10)
    assert (resumed.job_started, resumed.attempts) == (1000.0, 2)
    assert resumed.seconds["save"] == 9.0 and resumed.counts["save"] == 2
    assert resumed.seconds["failures"] == 96.0
    assert resumed.seconds["other"] == 25.0  # the first attempt's time in no category, up to its snapshot
    resumed.add("productive", 50.0, 10)
    assert resumed.goodput(1300.0) == pytest.approx(100.0 / 300.0)
    assert sum(resumed.snapshot(1300.0, saving=False)["seconds"][c] for c in CATEGORIES) == pytest.approx(300.0)
    # Without the save's end (no manifest), all of it after the snapshot is between the attempts.
    unsealed = GoodputAccount(1200.0)
    unsealed.continue_from(snapshot, saved_until=None, saved_iteration=10)
    assert unsealed.seconds["failures"] == 100.0 and unsealed.counts["save"] == 1
    # An in-job restart knows the failed attempt's last step (iteration 14 at 1150): the 4 steps after the checkpoint
    # stay productive (the restart redoes them, as "redone"), and the failure's time begins at that last step.
    restarted = GoodputAccount(1200.0)
    restarted.continue_from(snapshot, saved_until=1104.0, saved_iteration=10, failed_progress=(14, 1150.0))
    assert restarted.seconds["productive"] == 96.0 and restarted.counts["productive"] == 14
    assert restarted.seconds["failures"] == 50.0
    # A new attempt whose clock is behind the one that saved adds no negative time.
    skewed = GoodputAccount(1090.0)
    skewed.continue_from(snapshot, saved_until=1104.0, saved_iteration=10)
    assert skewed.seconds["save"] == 5.0 and skewed.seconds["failures"] == 0.0


def test_the_jobs_clock_starts_at_slurms_or_the_launchers_start_and_ends_at_the_close():
    from megatron_neobert.processes import process_start_time

    own, parent = process_start_time(), process_start_time(os.getppid())
    assert launch_parts({}, own) == []
    assert launch_parts({"TORCHELASTIC_RUN_ID": "x"}, own) == [(LAUNCHER_PART, pytest.approx(parent, abs=0.05))]
    slurm = {"TORCHELASTIC_RUN_ID": "x", "SLURM_JOB_START_TIME": str(int(parent) - 60), "GROUP_WORLD_SIZE": "3"}
    assert launch_parts(slurm, own) == [("SLURM job start to the launcher", int(parent) - 60),
                                        (LAUNCHER_PART, pytest.approx(parent, abs=0.05))]
    # A scheduler's clock ahead of this host's: no part begins after the next one.
    assert launch_parts({"SLURM_JOB_START_TIME": str(own + 5)}, own) == [("SLURM job start to this process", own)]
    # An in-job restart: the launcher's time since the failure is between attempts.
    assert launch_parts({**slurm, "TORCHELASTIC_RESTART_COUNT": "1"}, own) == []
    account = GoodputAccount.from_launch(slurm)
    assert account.job_started == int(parent) - 60
    assert [part for part, _ in account.startup_parts] == ["SLURM job start to the launcher", LAUNCHER_PART]
    assert account.seconds["startup"] == pytest.approx(own - account.job_started, abs=0.05)
    assert account.rendezvous_s == pytest.approx(own - parent, abs=0.05)
    # The run's end and the close are set after this process's start: a worker that xdist started long after its
    # parent has a start-up longer than any fixed figure.
    account.run_ended = own + 100.0
    final = account.close(own + 102.5)
    assert final["seconds"]["shutdown"] == 2.5 and final["rendezvous_s"] == account.rendezvous_s
    assert final["nodes"] == 3 and GoodputAccount.from_launch({}).snapshot(0.0, saving=False)["nodes"] == 1
    assert sum(final["seconds"][c] for c in CATEGORIES) == pytest.approx(own + 102.5 - account.job_started)
    # A checkpoint's account from before the shutdown row and the rendezvous: continued as it is.
    older = account_of(0.0, productive=(10.0, 2)).snapshot(20.0, saving=False)
    del older["seconds"]["shutdown"], older["rendezvous_s"]
    resumed = GoodputAccount(30.0)
    resumed.continue_from(older, saved_until=None, saved_iteration=2)
    assert (resumed.seconds["shutdown"], resumed.seconds["failures"], resumed.rendezvous_s) == (0.0, 10.0, 0.0)


def test_the_launchers_exit_goes_into_the_final_accounts_shutdown_once_it_exits(tmp_path):
    """The closer a rank starts with its run waits for the account's close, then for the launcher (here a stand-in,
    not its parent: it is watched by pidfd), and adds the time to its exit; it leaves alone an account written again
    since, and ends without touching anything when the rank ends without a final account."""
    path = str(tmp_path / GOODPUT_FILE)
    launcher = subprocess.Popen(["sleep", "3"])
    closer = LaunchersExitCloser.start(str(tmp_path), launcher.pid)
    account = account_of(0.0, productive=(10.0, 2))
    account.run_ended = time.time() - 1.0
    taken_at = time.time()
    account.close(taken_at)
    write_final_account(account, taken_at, 2, str(tmp_path), None)
    closer.close_at(taken_at)
    launcher.wait()
    exited_at = time.time()
    assert closer.process.wait(timeout=30) == 0
    with open(path) as f:
        closed = json.load(f)
    assert closed["launcher_exit_s"] == pytest.approx(exited_at - taken_at, abs=0.1)
    assert closed["seconds"]["shutdown"] == pytest.approx(1.0 + closed["launcher_exit_s"], abs=0.01)
    assert closed["taken_at"] == pytest.approx(exited_at, abs=0.1)
    assert sum(closed["seconds"][c] for c in CATEGORIES) == pytest.approx(closed["taken_at"] - closed["job_started"])
    assert not add_launchers_exit(path, taken_at, exited_at + 5)  # once only
    rewritten = closed["taken_at"] + 1  # a later run's account: not this closer's to touch
    write_final_account(account, rewritten, 2, str(tmp_path), None)
    assert not add_launchers_exit(path, taken_at, exited_at)
    # A rank that ends without a final account: its pipe closes with it, and the closer ends at once.
    launcher = subprocess.Popen(["sleep", "60"])
    try:
        closer = LaunchersExitCloser.start(str(tmp_path), launcher.pid)
        closer.process.stdin.close()
        assert closer.process.wait(timeout=30) == 0
    finally:
        launcher.kill()
    with open(path) as f:
        assert json.load(f)["taken_at"] == rewritten


def test_the_end_table_has_a_row_per_category_and_the_jobs_wall_time():
    account = account_of(0.0, startup=(10.0, 1), productive=(30.0, 6), redone=(6.0, 2), save=(2.0, 2))
    table = account.table(60.0)
    assert table.splitlines()[0] == "goodput 50.0%: where the job's time went"
    rows = {line[:50].strip(): line[50:].split() for line in table.splitlines()[2:]}
    assert rows["productive steps"] == ["30.0", "50.0%", "6"]
    assert rows["steps redone after a restart"] == ["6.0", "10.0%", "2"]
    assert rows["other"] == ["12.0", "20.0%"]
    assert rows["total (wall time since the job's first start)"] == ["60.0", "100.0%", "1", "attempt(s)"]


def an_account(save_s: float, step_s: float = 0.5) -> dict:
    return account_of(0.0, startup=(30.0, 1), productive=(100 * step_s, 100), save=(2 * save_s, 2)).snapshot(
        200.0, saving=False)


def test_auto_chooses_from_the_measurements_alone_and_longer_for_slower_saves():
    def choice(account):
        return SaveInterval("auto", 10, 64, 4.7e-4).choose(account)

    assert choice(an_account(10.0)) == choice(an_account(10.0))
    interval, line = choice(an_account(10.0))
    assert line.startswith(f"save interval (--save-interval auto): every {interval:,} iterations")
    assert "at the previous interval 10" in line
    assert choice(an_account(40.0))[0] == pytest.approx(2 * interval, abs=1)  # sqrt(4) times the interval
    assert choice(an_account(10.0, step_s=1.0))[0] == pytest.approx(interval / 2, abs=1)
    given = SaveInterval(100, 10, 64, 4.7e-4)
    best, line = given.choose(an_account(10.0))
    assert best == interval and "at --save-interval 100" in line
    assert given.choose(an_account(10.0)) is None  # said once


@pytest.mark.parametrize("flags,problem", [
    (["--save-interval", "0"], "--save-interval 0: give a number of iterations above 0, or auto"),
    (["--save-interval", "auto"], "--save-interval auto chooses when to save to --save: give it"),
    (["--failure-rate-per-gpu-day", "0"], "--failure-rate-per-gpu-day 0.0: give a rate above 0")])
def test_bad_save_interval_settings_are_refused_by_name(flags, problem, data):
    with pytest.raises(InputError, match=problem):
        parse_settings(tiny_argv(data[0], data[1], *flags))


@pytest.mark.integration
def test_the_account_goes_on_across_a_resume_and_is_saved_in_each_checkpoint(data, tmp_path):
    root = str(tmp_path / "ckpt")
    argv = tiny_argv(data[0], data[1], "--train-iters", "12", "--save", root, "--load", root, "--save-interval",
                     "3", "--eval-interval", "3", "--split", "90,10,0")
    first = run_on_ranks(run_train, 2, [*argv, "--exit-interval", "6"])[0]["goodput"]
    history = run_on_ranks(run_train, 2, argv)[0]
    job = history["goodput"]
    assert history["iteration"] == 12
    assert (first["attempts"], job["attempts"], job["job_started"]) == (1, 2, first["job_started"])
    assert job["counts"]["productive"] == 12 and job["counts"]["redone"] == 0
    # The second start-up, part by part: the load its own category, the rest start-up.
    parts = dict(history["startup"])
    assert list(parts)[:2] == ["input checks", "rendezvous"] and "checkpoint load" in parts
    assert job["seconds"]["load"] == pytest.approx(parts["checkpoint load"])
    assert job["seconds"]["startup"] - first["seconds"]["startup"] == pytest.approx(
        sum(seconds for part, seconds in parts.items() if part != "checkpoint load"))
    assert (job["counts"]["save"], job["counts"]["evaluation"], job["counts"]["load"]) == (4, 4, 1)
    assert job["seconds"]["productive"] > first["seconds"]["productive"] > 0
    assert job["seconds"]["failures"] > 0  # the first attempt's end and the second's start
    wall = job["taken_at"] - job["job_started"]
    assert sum(job["seconds"][c] for c in CATEGORIES) == pytest.approx(wall)
    _, common = read_checkpoint(root, 12, verify=False)
    saved = common["train_state"]["goodput"]
    assert saved["attempts"] == 2 and saved["job_started"] == first["job_started"]
    assert saved["counts"]["productive"] == 12 and saved["counts"]["save"] == 3  # this save is not in its own


@pytest.mark.integration
def test_auto_saves_first_at_the_log_interval_then_waits_longer_for_slower_saves(data, tmp_path):
    def interval(name: str, delay_s: float) -> int:
        root = str(tmp_path / name)
        # 1,000 failures per GPU-day: a mean time between failures of 86 s, so that the intervals fall in the run.
        history = run_on_ranks(run_train_with_slow_saves, 1, tiny_argv(
            data[0], data[1], "--train-iters", "8", "--save", root, "--save-interval", "auto",
            "--failure-rate-per-gpu-day", "1000"), delay_s)[0]
        assert read_checkpoint(root, 4, verify=False)[0] is not None  # the first save ends the first log interval
        return history["save_interval"]

    # Young/Daly's interval grows as the square root of the save's time: 1.5 times longer needs a save 2.25 times
    # slower. 5 s added keeps that so while a tiny model's save takes up to 4 s on busy cores (with 2 s it failed at
    # 36 against 52 iterations in a fresh clone's whole suite).
    fast, slow = interval("fast", 0.0), interval("slow", 5.0)
    assert slow > 1.5 * fast, (fast, slow)


def test_the_startup_benchmark_reads_the_start_up_line_back():
    from tools.benchmark_startup import startup_parts

    account = GoodputAccount(1000.0)
    account.startup_parts = [("imports", 7.25), ("checkpoint metadata, model shape and checks", 0.03),
                             ("checkpoint load", 0.5)]
    parts = startup_parts("earlier lines\n" + account.startup_line(0.125) + "\nlater lines\n")
    assert parts == {"imports": 7.25, "checkpoint metadata, model shape and checks": 0.03, "checkpoint load": 0.5,
                     "total": 7.78, "first step": 0.12}


def watch_exits(pids: list) -> dict:
    """{pid: time.monotonic() of its exit}, filled in by a thread as each of the processes `pids` ends (a zombie, or
    reaped)."""
    exits = {}

    def watch():
        while len(exits) < len(pids):
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    state = "gone"
                if state in ("Z", "X", "gone"):
                    exits.setdefault(pid, time.monotonic())
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    return exits


def ended(job: Job, ranks: list) -> tuple:
    """The torchrun job's wall clock, measured outside it from before its start: (to its last rank's exit, to its own
    exit)."""
    exits = watch_exits(ranks)
    assert job.proc.wait(timeout=600) == 0, job.output[-3000:]
    done = time.monotonic()
    deadline = done + 5
    while len(exits) < len(ranks) and time.monotonic() < deadline:
        time.sleep(0.02)
    return max(exits.values()) - job.started, done - job.started


def final_account(root: str) -> dict:
    """The job's final account, once the launcher's exit is in it (its closer adds it as torchrun exits)."""
    path, deadline = os.path.join(root, GOODPUT_FILE), time.monotonic() + 10
    while True:
        with open(path) as f:
            account = json.load(f)
        if "launcher_exit_s" in account or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert account.get("launcher_exit_s", 0) > 0, "torchrun's exit never reached the account"
    total = account["taken_at"] - account["job_started"]
    assert sum(account["seconds"][c] for c in CATEGORIES) == pytest.approx(total)
    assert account["seconds"]["shutdown"] > account["launcher_exit_s"]
    return account


@pytest.mark.integration
def test_the_final_account_sums_to_torchruns_wall_clock(data, tmp_path):
    """From torchrun's start to its exit: a plain run, then the same job requeued (a second torchrun resuming from its
    checkpoint, the total going on) that also restarts within itself (a rank killed, torchrun --max-restarts 1): the
    requeue's total holds both jobs, the moment between them and the restart's."""
    root = str(tmp_path / "ckpt")
    train = argv(data, "--train-iters", "8", "--save-interval", "2", "--log-interval", "1")
    first = Job([*train, "--save", root, "--load", root, "--exit-interval", "2"])
    plain_ranks, plain_wall = ended(first, first.ranks())
    plain = final_account(root)
    assert f"{LAUNCHER_PART} " in first.output and plain["attempts"] == 1 and plain["rendezvous_s"] > 0
    requeued = Job([*train, "--save", root, "--load", root], "--max-restarts", "1")
    _, rank1 = requeued.ranks()
    # Past a checkpoint of its own, which holds the requeue's attempt: the restart resumes from it or a later one.
    requeued.wait_for(r"saved checkpoint at iteration 4 ")
    os.kill(rank1, signal.SIGKILL)
    requeued.wait_for(RESTARTED)
    requeue_ranks, requeue_wall = ended(requeued, requeued.ranks())
    requeue = final_account(root)
    assert requeue["attempts"] == 3 and requeue["job_started"] == plain["job_started"]
    assert requeue["counts"]["productive"] == 8
    both_walls = requeued.started + requeue_wall - first.started  # both jobs and the moment between them
    totals = {name: account["taken_at"] - account["job_started"] for name, account in
              (("plain", plain), ("requeue", requeue))}
    print(f"account total vs wall clock from torchrun's start to its exit (its last rank's exit; the launcher's exit "
          f"in the account): plain {totals['plain']:.2f} s vs {plain_wall:.2f} s ({plain_ranks:.2f} s; "
          f"{plain['launcher_exit_s']:.2f} s); requeue with an in-job restart {totals['requeue']:.2f} s vs "
          f"{both_walls:.2f} s (the two jobs {plain_wall:.2f} + {requeue_wall:.2f} s; {requeue_ranks:.2f} s; "
          f"{requeue['launcher_exit_s']:.2f} s)")
    assert abs(totals["plain"] - plain_wall) < 1.0
    assert abs(totals["requeue"] - both_walls) < 1.0
