"""What the guards decide from what they measured: a host silent past the bound ends the attempt (`lost_host`), and so
does this host, thawed after it was stopped past that bound (`thawed`); a rank that stays slow is named, and on request
its host's part of the job ends (`StragglerRule`, which counts windows across the run). A rule returns its verdict, or
None where it finds nothing; the part that measured acts on it (the watchdog, the straggler detector)."""

import dataclasses
import os
import statistics
from typing import Dict, List, Optional, Tuple

from megatron_neobert.training.resilience.guards.hosts import ANSWER_S, Answers, Host


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The `error:` line that ends the attempt, and whether torchrun must end with it (it cannot restart anything
    without the host it lost)."""
    line: str
    end_torchrun: bool


def lost_host(found: Answers, store: Host, iteration: int, phase: str, idle: float,
              launcher: Optional[int]) -> Optional[Verdict]:
    """A host silent past the bound: an asked rank's host, or the rendezvous store (`store`), gave no answer within
    ANSWER_S after `idle` seconds without progress in `phase` of `iteration`. A rank that reaches neither is the one
    cut off, and one that cannot reach the store's host has lost it: either way its torchrun (`launcher`, None outside
    torchrun) cannot restart anything (its store calls to that host wait on TCP's retries, about 15 minutes), so it
    ends too."""
    if not found.someone_silent:
        return None
    rank = os.environ.get("RANK", "0")
    why = f"at iteration {iteration} ({phase}; no answer within {ANSWER_S:g} s after {idle:.0f} s without progress)"
    and_torchrun = f" and torchrun (pid {launcher}), which cannot restart it without that host" if launcher else ""
    if found.cut_off:
        line = (f"error: rank {rank}: the rendezvous host {store.name} ({store.address}) is unreachable {why}: "
                f"this host is cut off from the job; ending this attempt{and_torchrun}")
    elif found.store_silent:
        line = (f"error: rank {rank}: the rendezvous host {store.name} ({store.address}) stopped answering {why}; "
                f"the job cannot go on without its store: ending this attempt{and_torchrun}")
    else:
        names = ", ".join(f"{host.name} ({host.address})" for host in found.silent)
        then = ("torchrun restarts it, or goes on without the host under --nnodes MIN:MAX" if launcher else
                "srun --kill-on-bad-exit ends the job step; its requeue resumes from the latest checkpoint")
        line = (f"error: rank {rank}: host{'s' if len(found.silent) > 1 else ''} {names} stopped answering {why}; "
                f"ending this attempt ({then})")
    # A lost host that is not the store's: torchrun restarts the workers, or goes on without the host.
    return Verdict(line, end_torchrun=bool(launcher) and found.store_silent)


def silent_bound(host_check_after_s: float) -> float:
    """How long a host may say nothing before every rank that waits on it has named it lost: the check after
    `host_check_after_s`, looked at every quarter of it, and ANSWER_S for the answer."""
    return 1.25 * host_check_after_s + ANSWER_S


def thawed(stopped_s: float, host_check_after_s: float, launcher: Optional[int]) -> Optional[Verdict]:
    """This host frozen past the bound: its processes were stopped (SIGSTOP, a paused VM) for `stopped_s`, longer than
    the others wait before naming it lost (`silent_bound`), so the job went on without it or ended. What it would do
    now (finish a step, save, log, close the goodput account) would write over what the job wrote since: it ends at
    once instead, and its torchrun with it, which would otherwise restart it into the rendezvous (a restart of every
    host from the latest checkpoint)."""
    bound = silent_bound(host_check_after_s)
    if stopped_s <= bound:
        return None
    and_torchrun = f" and torchrun (pid {launcher})" if launcher else ""
    return Verdict(f"error: rank {os.environ.get('RANK', '0')}: this host was stopped for {stopped_s:.0f} s, longer "
                   f"than the other hosts wait before going on without it ({bound:g} s): ending this attempt"
                   f"{and_torchrun} without writing anything (start it again to rejoin the job)",
                   end_torchrun=bool(launcher))


# The fewest steps the straggler rule judges together: a busy machine's bursts average out (`StragglerRule`).
MIN_WINDOW_STEPS = 8


@dataclasses.dataclass(frozen=True)
class RankTime:
    """A rank's compute time per step over an interval: its step less its wait for the others."""
    rank: int
    host: str
    compute_s: float


def slowest(times: List[RankTime]) -> Tuple[RankTime, float]:
    """The slowest rank and how many times the median of the others' compute time it takes."""
    worst = max(times, key=lambda t: t.compute_s)
    others = statistics.median(t.compute_s for t in times if t is not worst)
    return worst, worst.compute_s / others if others > 0 else 1.0


@dataclasses.dataclass(frozen=True)
class StragglerVerdict:
    """What a judged window decides: the lines to print (the warning, the recovery), the seconds the others waited for
    a named straggler (the goodput account's), and the host whose part of the job ends (--straggler-exit-intervals)."""
    lines: Tuple[str, ...] = ()
    straggler_s: float = 0.0
    drain: Optional[str] = None


@dataclasses.dataclass
class _Window:
    """Judged log intervals combined: from iteration `first`, `steps` steps, rank 0's wall seconds, and each rank's
    (rank, host) compute seconds."""
    first: int
    compute_s: Dict[Tuple[int, str], float]
    last: int = 0
    steps: int = 0
    wall_s: float = 0.0


@dataclasses.dataclass
class _Slow:
    """A host whose slowest rank has been slow for `count` judged windows in a row, since iteration `since`."""
    host: str
    since: int
    count: int = 0
    cost_s: float = 0.0  # the others' wait for it so far: the account's once it is named


class StragglerRule:
    """The straggler rule (`straggler.py` measures and exchanges what it judges): a rank slower than `threshold` x the
    median of the others for `intervals` judged windows in a row is named, once, with its host, since when and what
    it costs the job's steps; its recovery is said; with `exit_intervals`, once it has been slow that many windows its
    host is the one to drain. Rank 0 holds it, across the run.

    A window holds at least MIN_WINDOW_STEPS steps: a log interval that long is one, shorter consecutive ones are
    combined (each rank's compute time summed over their steps); an interval not judged (the start-up, a save, a
    validation, a rank's time missing) drops the window under way. Persistence is counted in windows, so a window
    must hold enough steps for a busy machine's bursts to average out: such a machine slows one process against
    another for a second or two. Undisturbed, two gloo ranks of the tiny model (50-200 ms steps) on 2 cores at a load
    of 9-15 had one rank 1.2-4.6x the other in 3 to 5 intervals of 2 steps in a row in 3 of 8 runs of 60-80 steps,
    whichever way an interval's time was taken (its steps' mean; their median; its fastest step, which did worst), and
    a longer run of short intervals only waits for a longer burst, while one burst of the healthy rank breaks a real
    straggler's run; at 6 or 8 steps an interval, never 3 in a row. At Megatron-LM's usual --log-interval 100 every
    interval is a window."""

    def __init__(self, threshold: float, intervals: int, exit_intervals: Optional[int]):
        self.threshold, self.intervals, self.exit_intervals = threshold, intervals, exit_intervals
        self.slow: Optional[_Slow] = None
        self._window: Optional[_Window] = None  # the judged intervals combined so far

    def skip(self) -> None:
        """A log interval not judged: the window under way is dropped (a slow host's count goes on with the next)."""
        self._window = None

    def interval(self, first: int, last: int, step_s: float, times: List[RankTime]) -> StragglerVerdict:
        """A judged log interval of iterations `first`..`last`: rank 0's wall time per step `step_s`, every rank's
        `times`. Combined into the window under way, which is judged once it holds MIN_WINDOW_STEPS steps."""
        steps = last - first + 1
        window = self._window = self._window or _Window(first, {(t.rank, t.host): 0.0 for t in times})
        window.last, window.steps, window.wall_s = last, window.steps + steps, window.wall_s + step_s * steps
        for t in times:
            window.compute_s[t.rank, t.host] += t.compute_s * steps
        if window.steps < MIN_WINDOW_STEPS:
            return StragglerVerdict()
        self._window = None
        return self._judge(window.first, window.last, window.wall_s / window.steps,
                           [RankTime(rank, host, seconds / window.steps)
                            for (rank, host), seconds in window.compute_s.items()])

    def _judge(self, first: int, last: int, step_s: float, times: List[RankTime]) -> StragglerVerdict:
        """The window of iterations `first`..`last`: rank 0's wall time per step `step_s`, every rank's `times`."""
        worst, ratio = slowest(times)
        lines = []
        if ratio < self.threshold or (self.slow and self.slow.host != worst.host):
            lines += self._recovered(last, ratio)
        if ratio < self.threshold:
            return StragglerVerdict(tuple(lines))
        extra_s = worst.compute_s * (1 - 1 / ratio)  # what the others wait for it, each step
        slow = self.slow = self.slow or _Slow(worst.host, first)
        slow.count += 1
        slow.cost_s += extra_s * (last - first + 1)
        straggler_s = 0.0
        if slow.count >= self.intervals:  # a one-off pause costs the account nothing of this
            straggler_s, slow.cost_s = slow.cost_s, 0.0
        if slow.count == self.intervals:
            slower = extra_s / max(step_s - extra_s, 1e-9)
            lines.append(f"warning: straggler: rank {worst.rank} on host {worst.host} computes "
                         f"{worst.compute_s * 1000:.1f} ms a step, {ratio:.2f}x the median of the other ranks, since "
                         f"iteration {slow.since}: the job's steps take {100 * slower:.0f}% longer than without it")
        drain = slow.host if self.exit_intervals and slow.count == max(self.exit_intervals, self.intervals) else None
        return StragglerVerdict(tuple(lines), straggler_s, drain)

    def _recovered(self, last: int, ratio: float) -> List[str]:
        slow, self.slow = self.slow, None
        if slow and slow.count >= self.intervals:
            return [f"straggler recovered: host {slow.host} is within {self.threshold}x the other ranks' median again "
                    f"by iteration {last} (slowest rank {ratio:.2f}x); it was slow from iteration {slow.since}"]
        return []
