"""`--profile`: the PyTorch profiler around a window of training steps, on chosen ranks.

As Megatron-LM's `--profile --use-pytorch-profiler`, the window opens when the run's iteration is
`--profile-step-start` and closes when it is `--profile-step-end`: steps start+1 .. end (a run
resumed past the start profiles nothing). At the close each rank of `--profile-ranks` writes a
Chrome / TensorBoard trace (`rank{R}_steps{a}-{b}.pt.trace.json`) and prints its costliest operators.
"""

import logging
import os
from typing import Optional

import torch

from megatron_neobert.errors import InputError
from megatron_neobert.training.reporting.train_log import EVERY_RANK

TOP_OPS = 15

logger = logging.getLogger(__name__)


class StepProfiler:
    def __init__(self, settings):
        options = settings.profiling
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if options.profile and any(r >= world for r in options.profile_ranks):
            raise InputError(f"--profile-ranks {options.profile_ranks}: this run has ranks 0 to {world - 1}")
        self.enabled = options.profile and rank in options.profile_ranks
        self.rank, self.start, self.end = rank, options.profile_step_start, options.profile_step_end
        self.with_stack = options.pytorch_profiler_collect_callstack
        # TensorBoard's profiler plugin reads traces in its log folder; settings.py checks that one is given.
        self.directory = ((settings.logging.tensorboard_dir or os.path.join(settings.checkpoint.save, "profile"))
                          if self.enabled else None)
        self._prof: Optional[torch.profiler.profile] = None
        self._last = None

    def step_begins(self, iteration: int) -> None:
        """Before the step that follows `iteration` completed ones."""
        if self.enabled and iteration == self.start:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            # The window is opened and closed by hand; a schedule that always records is there for the
            # per-step ProfilerStep#N markers in the trace (torch adds them only with a schedule).
            self._prof = torch.profiler.profile(activities=activities, record_shapes=True,
                                                with_stack=self.with_stack,
                                                schedule=lambda step: torch.profiler.ProfilerAction.RECORD)
            self._prof.start()

    def step_ends(self, iteration: int) -> None:
        if self._prof is None:
            return
        self._last = iteration
        if iteration == self.end:
            self.stop()
        else:
            self._prof.step()  # the next ProfilerStep#N marker

    def stop(self) -> None:
        """Close the window (also when the run stops inside it): write the trace, print the top ops."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.stop()
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"rank{self.rank}_steps{self.start + 1}-{self._last}.pt.trace.json")
        prof.export_chrome_trace(path)
        device = "device" if torch.cuda.is_available() else "cpu"
        table = prof.key_averages().table(sort_by=f"self_{device}_time_total", row_limit=TOP_OPS)
        logger.info(f"profile of steps {self.start + 1}-{self._last} on rank {self.rank}: trace {path}; "
                    f"top {TOP_OPS} operators by self {device} time:\n{table}", extra=EVERY_RANK)
