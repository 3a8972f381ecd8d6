"""What the guards decide from what they measured, one rule a function: a host silent past the bound ends the attempt
(`lost_host`), and so does this host, thawed after it was stopped past that bound (`thawed`). A rule returns a
`Verdict`, or None where it finds nothing; the watchdog acts on it."""

import dataclasses
import os
from typing import Optional

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
