"""The run's account of wall time: where every second since the job's first start went, and its goodput (the share
spent on steps that count).

The job's clock starts at the earliest moment the job can know (`launch_parts`): SLURM's job start where set, else
the torchrun agent's start (the rank's parent), else the rank's own start. It ends when the run's process groups are
destroyed (`close`), just before the process exits, where the final account is written; under torchrun, a process
of its own then waits for torchrun's exit and adds the time to it to the shutdown (`LaunchersExitCloser`): the
rows sum to the job's wall time from the launcher's start to its exit. Any process that imports torch takes about a
second of CPU to exit (the interpreter's teardown of torch's modules), the rank's and torchrun's alike, and only
something that outlives torchrun can see its end.

Categories (seconds, each measured where it happens, never inferred from step counts):
- startup: this attempt's start to its first step (from SLURM's job start or the launcher's start: the launcher's
  start-up and rendezvous; then imports, input checks, process groups, model, optimizer, data), less the checkpoint
  load;
- load: the checkpoint load;
- productive: training steps done for the first time;
- redone: steps a restarted attempt does again because the failed attempt did them after its last checkpoint (in-job
  restarts, where torchrun's store kept the failed attempt's progress); their first doing stays productive, so that
  each lost step is charged once, as Young/Daly's expected loss counts it;
- skipped: steps whose loss or gradients were not finite (no update);
- evaluation: validations;
- save: the blocking part of checkpoint saves (all of a synchronous save, the staging of an --async-save, and
  waiting for a background write to finish);
- shutdown: from the run's end (its last step, save and table) to the account's close (the logs closed, the
  process groups destroyed, the guards ended), and under torchrun on to torchrun's exit (the ranks' exit, torchrun's
  exit barrier and its own exit: `launcher_exit_s` of the final account);
- failures: between two attempts: from the failed attempt's last step to the next attempt's process start (the
  failure's detection, the restart or the requeue). Where the failed attempt's progress is unknown (torchrun's store
  went with it, a requeue), from the end of the checkpoint the next attempt loads: the steps done after it are
  lost in this row then, and not counted as redone;
- other: the rest (logging, the stop agreement, the end of the run).

An --async-save's background write overlaps training: it is kept apart ("async_save_background") and is no part of
the wall time; so is the time a straggler cost ("straggler", `training/resilience/guards/rules.py`): the other ranks'
wait for it, inside the steps' rows, while it was slow. A straggler's host whose part of the job ended
(--straggler-exit-intervals) is listed ("drained_hosts"); the exclusion's cost is the restart's, in "failures".
The account is saved in each checkpoint (`snapshot`) and continued by a run that resumes from it, so goodput is that
of the job since its first start, across restarts and requeues.
"""

import json
import os
import select
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Tuple

from megatron_neobert.processes import process_start_time


# The wall-time categories, in the end-of-run table's order, with their rows' names.
CATEGORIES = {"startup": "start-up", "load": "checkpoint load", "productive": "productive steps",
              "redone": "steps redone after a restart", "skipped": "skipped steps (non-finite)",
              "evaluation": "evaluation", "save": "checkpoint save (blocking)",
              "shutdown": "shutdown (logs, process groups, exit)",
              "failures": "between attempts (detection, restart)", "other": "other"}
GOODPUT_FILE = "goodput.json"  # the final account, in --save
COUNTED = ("productive", "redone", "skipped", "evaluation", "save", "load")
# The start-up parts whose cost grows with the job's size (the launchers meeting, the process groups): the goodput
# model takes the rendezvous cost from their sum (`rendezvous_s` of the account).
LAUNCHER_PART = "launcher start-up and rendezvous"
RENDEZVOUS_PARTS = (LAUNCHER_PART, "rendezvous")


def launch_parts(environ: Mapping[str, str], process_started: float) -> List[Tuple[str, float]]:
    """(part, when it began) of the job's time before this process started, earliest first: from SLURM's job start
    (SLURM_JOB_START_TIME, epoch seconds) and from the torchrun agent's start (the rank's parent, where
    TORCHELASTIC_RUN_ID says torchrun started the rank). None after an in-job restart: the launcher's time since the
    failure is between attempts, and its start before the first attempt is in that attempt's account."""
    if int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")):
        return []
    launcher = process_start_time(os.getppid()) if "TORCHELASTIC_RUN_ID" in environ else None
    parts = []
    if environ.get("SLURM_JOB_START_TIME"):
        parts.append((f"SLURM job start to {'the launcher' if launcher else 'this process'}",
                      float(environ["SLURM_JOB_START_TIME"])))
    if launcher is not None:
        parts.append((LAUNCHER_PART, launcher))
    began, kept = process_started, []
    for part, at in reversed(parts):  # each no later than the next: the scheduler's clock may be ahead of this host's
        began = min(at, began)
        kept.insert(0, (part, began))
    return kept


class GoodputAccount:
    """Seconds per category of the job (continued from a checkpoint's `snapshot`) and of this attempt."""

    def __init__(self, attempt_started: float):
        self.attempt_started = attempt_started
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.counts = dict.fromkeys(COUNTED, 0)
        self.async_save_background = 0.0
        self.job_started, self.attempts = attempt_started, 1
        self.startup_parts: List[Tuple[str, float]] = []  # this attempt's, for its start-up line
        self.last_lap = attempt_started
        self.rendezvous_s = 0.0  # the job's RENDEZVOUS_PARTS, in start-up
        self.nodes = 1  # this attempt's launchers (torchrun's agents): the goodput model's rendezvous per node
        self.run_ended: Optional[float] = None  # the run's last step, save and table done: the shutdown begins
        self.straggler_s = 0.0  # the steps' time lost waiting for a straggler (within the steps' rows)
        self.drained_hosts: List[str] = []  # straggler hosts whose part of the job ended

    @classmethod
    def from_launch(cls, environ: Mapping[str, str] = os.environ) -> "GoodputAccount":
        """This process's account, from the job's first moment it can know (`launch_parts`), each part before the
        process's start a start-up part of its own."""
        process_started = process_start_time() or time.time()
        parts = launch_parts(environ, process_started)
        account = cls(parts[0][1] if parts else process_started)
        account.nodes = int(environ.get("GROUP_WORLD_SIZE", "1"))  # torchrun's: the agents in the rendezvous
        for (part, _), ended in zip(parts, [at for _, at in parts[1:]] + [process_started]):
            account.lap(part, at=ended)
        return account

    def lap(self, part: str, category: str = "startup", at: Optional[float] = None) -> None:
        """The start-up's `part` ends now, or `at` (it began where the last one ended): its time goes to
        `category`."""
        now = time.time() if at is None else at
        self.startup_parts.append((part, now - self.last_lap))
        self.add(category, now - self.last_lap)
        if part in RENDEZVOUS_PARTS:
            self.rendezvous_s += now - self.last_lap
        self.last_lap = now

    def startup_line(self, first_step_s: float) -> str:
        parts = ", ".join(f"{part} {seconds:.2f} s" for part, seconds in self.startup_parts)
        return (f"start-up {sum(s for _, s in self.startup_parts):.2f} s to the first step: {parts}; first step "
                f"{first_step_s:.2f} s")

    def continue_from(self, saved: dict, saved_until: Optional[float], saved_iteration: int,
                      failed_progress: Optional[Tuple[int, float]] = None) -> None:
        """The job's account goes on from `saved`, that of the checkpoint of `saved_iteration` this attempt resumed
        from. `saved_until`: when that checkpoint's save ended (its manifest's time), which the account predates by
        the save; `failed_progress`: (iteration, time) of the failed attempt's last step, where known."""
        self.job_started, self.attempts = saved["job_started"], saved["attempts"] + 1
        for name in CATEGORIES:  # a checkpoint saved before the shutdown row existed has none
            self.seconds[name] += saved["seconds"].get(name, 0.0)
        for name in COUNTED:
            self.counts[name] += saved["counts"][name]
        self.async_save_background += saved["seconds"].get("async_save_background", 0.0)
        self.rendezvous_s += saved.get("rendezvous_s", 0.0)
        self.straggler_s += saved["seconds"].get("straggler", 0.0)
        self.drained_hosts = saved.get("drained_hosts", []) + self.drained_hosts
        taken_at = saved["taken_at"]
        if saved.get("saving") and saved_until is not None:  # the save the snapshot was taken in
            # Clamped: the hosts' clocks (and the manifest's file system's) may disagree a little.
            finished = max(taken_at, min(saved_until, self.attempt_started))
            self.add("save", finished - taken_at)
            taken_at = finished
        if failed_progress is not None:
            reached, last_step_at = failed_progress
            if reached > saved_iteration and taken_at < last_step_at <= self.attempt_started:
                self.add("productive", last_step_at - taken_at, reached - saved_iteration)
                taken_at = last_step_at
        self.seconds["failures"] += max(0.0, self.attempt_started - taken_at)

    def add(self, category: str, seconds: float, count: int = 1) -> None:
        self.seconds[category] += seconds
        if category in self.counts:
            self.counts[category] += count

    def close(self, now: float) -> dict:
        """The account's end (`now`: the process exits next): the time since the run's end is the shutdown; the
        final account (a snapshot)."""
        if self.run_ended is not None:
            self.add("shutdown", now - self.run_ended)
            self.run_ended = None
        return self.snapshot(now, saving=False)

    def wall(self, now: float) -> float:
        return now - self.job_started

    def goodput(self, now: float) -> float:
        wall = self.wall(now)
        return self.seconds["productive"] / wall if wall > 0 else 0.0

    def _with_other(self, now: float) -> Dict[str, float]:
        seconds = dict(self.seconds)
        seconds["other"] = max(0.0, self.wall(now) - sum(v for k, v in seconds.items() if k != "other"))
        return seconds

    def snapshot(self, now: float, saving: bool) -> dict:
        """The account as a checkpoint keeps it (`saving`: taken by a blocking save, whose own time the resuming
        attempt adds from the checkpoint's files)."""
        return {"job_started": self.job_started, "taken_at": now, "attempts": self.attempts, "saving": saving,
                "seconds": {**self._with_other(now), "async_save_background": self.async_save_background,
                            "straggler": self.straggler_s},
                "counts": dict(self.counts), "rendezvous_s": self.rendezvous_s, "nodes": self.nodes,
                "drained_hosts": list(self.drained_hosts)}

    def scalars(self, now: float) -> List[Tuple[str, float]]:
        """TensorBoard's goodput/ tags: the goodput and each category's seconds so far."""
        return [("goodput/goodput", self.goodput(now))] + \
            [(f"goodput/{name}_s", value) for name, value in self._with_other(now).items()] + \
            [("goodput/async_save_background_s", self.async_save_background),
             ("goodput/straggler_s", self.straggler_s)]

    def table(self, now: float) -> str:
        """The end-of-run table: each category's time, share of the wall time and count."""
        wall, seconds = self.wall(now), self._with_other(now)
        rows = [(CATEGORIES[name], value, f"{self.counts[name]:,}" if name in self.counts else "")
                for name, value in seconds.items()]
        rows.append(("total (wall time since the job's first start)", wall, f"{self.attempts} attempt(s)"))
        width = max(len(label) for label, _, _ in rows)
        lines = [f"goodput {100 * self.goodput(now):.1f}%: where the job's time went",
                 f"{'':{width}}  {'seconds':>12}  {'share':>6}  count"]
        lines += [f"{label:{width}}  {value:12,.1f}  {100 * value / wall if wall > 0 else 0:5.1f}%  {count}"
                  for label, value, count in rows]
        lines.append(f"{'asynchronous save writing (background)':{width}}  {self.async_save_background:12,.1f}  "
                     f"{'':6}  (overlaps training)")
        if self.straggler_s or self.drained_hosts:
            lines.append(f"{'waiting for a straggler (within the steps)':{width}}  {self.straggler_s:12,.1f}  "
                         f"{100 * self.straggler_s / wall if wall > 0 else 0:5.1f}%  "
                         f"{'drained: ' + ', '.join(self.drained_hosts) if self.drained_hosts else ''}")
        return "\n".join(lines)


def write_final_account(account: GoodputAccount, now: float, iteration: int, save: Optional[str],
                        tensorboard_dir: Optional[str]) -> None:
    """The closed account, last thing before the exit: `save`/GOODPUT_FILE (written atomically: a reader never sees
    half of it) and TensorBoard's goodput/ tags at `iteration`, their last point."""
    if save:
        from megatron_neobert.atomic_write import write_json_atomic

        os.makedirs(save, exist_ok=True)
        write_json_atomic(os.path.join(save, GOODPUT_FILE), account.snapshot(now, saving=False))
    if tensorboard_dir:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(tensorboard_dir)
        for tag, value in account.scalars(now):
            writer.add_scalar(tag, value, iteration)
        writer.close()


# How long the account's closer waits for torchrun after the last rank's close: torchrun's exit barrier waits up to
# 300 s for the other hosts' agents; a torchrun still there after this is stuck, and the account stays at the close.
LAUNCHER_EXIT_WAIT_S = 600


class LaunchersExitCloser:
    """The process that adds the launcher's exit to the final account in `save` (GOODPUT_FILE): started with the
    run by the rank that will write that account, so that it is waiting, its own start long done, when the launcher
    exits (Python's start alone can take longer than torchrun's exit on busy cores). Told the account's close
    (`close_at`), it waits for the launcher to exit and adds the time since the close to the shutdown; a rank that
    ends without a final account (an error, a kill) closes its pipe by its exit, and the closer ends. In a session
    of its own, so that the signals to the job's process groups pass it by; it holds none of the job's output."""

    def __init__(self, save: str, launcher_pid: int):
        path = os.path.join(save, GOODPUT_FILE)
        launcher = os.pidfd_open(launcher_pid)  # opened here, while the launcher is certainly this rank's parent
        try:
            self.process = subprocess.Popen([sys.executable, "-m", __name__, path, str(launcher)], text=True,
                                            pass_fds=(launcher,), start_new_session=True, stdin=subprocess.PIPE,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(launcher)

    @classmethod
    def start(cls, save: str, launcher_pid: int) -> Optional["LaunchersExitCloser"]:
        """The closer, or None where the kernel cannot watch a process that is not a child (pidfd, Linux 5.3)."""
        try:
            return cls(save, launcher_pid)
        except (AttributeError, OSError):
            return None

    def close_at(self, taken_at: float) -> None:
        """The final account was written, closed at `taken_at`. A closer gone meanwhile (killed by hand) costs the
        account the launcher's exit, never the run its end."""
        try:
            self.process.stdin.write(f"{taken_at!r}\n")
            self.process.stdin.close()
        except OSError:  # BrokenPipeError: nobody reads the pipe any more
            pass


def add_launchers_exit(path: str, taken_at: float, exited_at: float) -> bool:
    """The final account at `path`, closed at `taken_at`, goes on to `exited_at` (the launcher's exit) in its
    shutdown row; whether it did (not when the file has been written again since, by a later run)."""
    from megatron_neobert.atomic_write import write_json_atomic

    with open(path) as f:
        account = json.load(f)
    if account["taken_at"] != taken_at or "launcher_exit_s" in account:
        return False
    exit_s = max(0.0, exited_at - taken_at)
    account["seconds"]["shutdown"] += exit_s
    account["launcher_exit_s"], account["taken_at"] = exit_s, taken_at + exit_s
    write_json_atomic(path, account)
    return True


def _wait_and_add_launchers_exit(path: str, launcher_fd: str) -> None:
    """The closer's whole work (`LaunchersExitCloser` starts it; no command of its own): the account's close comes on
    stdin (nothing: the rank ended without one), then `launcher_fd`, a pidfd of the launcher, becomes readable when
    the launcher exits."""
    closed_at = sys.stdin.readline()
    if closed_at and select.select([int(launcher_fd)], [], [], LAUNCHER_EXIT_WAIT_S)[0]:
        add_launchers_exit(path, float(closed_at), time.time())


if __name__ == "__main__":
    _wait_and_add_launchers_exit(*sys.argv[1:])
