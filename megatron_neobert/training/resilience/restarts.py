"""What a restart cost and changed, said once the restarted run is back: one line each.

- In-job restarts (torchrun --max-restarts, a lost node under --nnodes MIN:MAX): rank 0 records each step's
  iteration and time in the job's store (torchrun's agent store, outside any attempt's names, so that it outlives the
  workers). A restarted attempt's rank 0 reads what the failed attempt reached and, after its first step, says
  "restarted after failure: resumed at iteration N, K steps redone, S s lost" (S: from the failed attempt's last step
  to this first one). Where the store went with the failed attempt (its host was lost, or torchrun does not share it),
  the line says that the failed attempt's progress is unknown.
- A resume at another world size: "world size 4 -> 2: gradient accumulation 2 -> 4"; the global batch, the sample
  order and the schedule stay those of the run.
"""

import logging
import os
import time
from datetime import timedelta
from typing import Optional

import torch

from megatron_neobert.parallel.rendezvous import JOB_PREFIX, agent_store, uses_agent_store
from megatron_neobert.checkpoint.state import checkpoint_args
from megatron_neobert.training.resilience.guards.launcher import LauncherWatch

logger = logging.getLogger(__name__)

PROGRESS_KEY = f"{JOB_PREFIX}/progress"


class RestartReport:
    """On rank 0 under torchrun: `step_done` after every training step records the progress and, after the first
    step of a restarted attempt, says what the restart cost. Does nothing elsewhere."""

    def __init__(self, resumed_at: int, timeout: timedelta, launcher: LauncherWatch):
        self.resumed_at, self.reported, self.launcher = resumed_at, False, launcher
        rank0 = torch.distributed.get_rank() == 0
        self.store = agent_store(timeout) if rank0 and uses_agent_store() else None
        self.restarted = rank0 and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        self.failed_at = None  # (iteration, time) the failed attempt reached
        if self.store is not None and self.store.check([PROGRESS_KEY]):
            iteration, at = self.store.get(PROGRESS_KEY).decode().split()
            self.failed_at = (int(iteration), float(at))

    def redoes(self, iteration: int) -> bool:
        """Whether the failed attempt had already done `iteration` (and lost it): known on rank 0 alone."""
        return self.failed_at is not None and iteration <= self.failed_at[0]

    def step_done(self, iteration: int) -> None:
        now = time.time()
        if not self.reported:
            self.reported = True
            if self.failed_at is not None:
                reached, at = self.failed_at
                logger.info(f"restarted after failure: resumed at iteration {self.resumed_at}, "
                            f"{max(0, reached - self.resumed_at)} steps redone, {now - at:.1f} s lost")
            elif self.restarted:
                logger.info(f"restarted after failure: resumed at iteration {self.resumed_at} (the failed attempt's "
                            f"progress is unknown: torchrun's store did not keep it)")
        if self.store is not None:
            try:
                self.store.set(PROGRESS_KEY, f"{iteration} {now}")
            except torch.distributed.DistNetworkError:  # torchrun hosts the store: gone with it, say so
                self.launcher.exit_if_gone()
                raise


def world_size_change(common: dict, num_micro_batches: int) -> Optional[str]:
    """What a resume at another world size changed, or None at the checkpoint's."""
    args = checkpoint_args(common)
    saved_world, world = args.get("world_size"), torch.distributed.get_world_size()
    if saved_world is None or saved_world == world:
        return None
    saved_micro = args["global_batch_size"] // (args["micro_batch_size"] * args["data_parallel_size"])
    return (f"world size {saved_world} -> {world}: gradient accumulation {saved_micro} -> {num_micro_batches}")
