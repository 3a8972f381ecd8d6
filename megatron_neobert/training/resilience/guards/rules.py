"""What the guards decide from what they measured, one rule a function: a host silent past the bound ends the attempt
(`lost_host`). A rule returns a `Verdict`, or None where it finds nothing; the watchdog acts on it."""

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
