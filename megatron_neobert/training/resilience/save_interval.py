"""When the trainer saves: every --save-interval iterations, or with `--save-interval auto` at the interval that
wastes least for the costs measured so far.

A save of C seconds every tau seconds of work costs C/tau of the run; a failure, on average every M seconds, loses the
work since the last save, tau/2 on average: the loss C/tau + tau/(2M) is smallest at tau = sqrt(2 C M) (Young 1974,
Daly 2006). C is the mean blocking save time of this run's account, M = 1 day / (--failure-rate-per-gpu-day x GPUs).
"""

import logging
from typing import Optional, Tuple

from megatron_neobert.training.reporting.metrics import format_duration
from megatron_neobert.training.resilience.goodput_model import (RunCosts, costs_from_account, expected_goodput,
                                                                interval_iterations, mtbf_s)

logger = logging.getLogger(__name__)


def describe_choice(costs: RunCosts, mtbf: float, gpus: int, rate: float, chosen: int, other: int,
                    other_name: str) -> str:
    """The line that gives an interval, the measurements it comes from and the expected goodput at it and at
    `other` iterations."""
    def goodput(iterations: int) -> str:
        return f"{100 * expected_goodput(costs, gpus, iterations * costs.step_s, mtbf):.1f}%"

    return (f"every {chosen:,} iterations ({format_duration(chosen * costs.step_s)} of steps at {costs.step_s:.3f} s "
            f"a step): blocking save {costs.save_s:.2f} s, mean time between failures {format_duration(mtbf)} "
            f"({rate:.3g} per GPU-day x {gpus:,} GPUs), restart {costs.restart_s(gpus):.0f} s (start-up and load "
            f"measured, {costs.detection_s:.0f} s to detect a failure assumed); expected goodput {goodput(chosen)} "
            f"at it, {goodput(other)} at {other_name} {other:,}")


class SaveInterval:
    """`due(iteration, last_saved)`: whether the interval asks for a save now; `measured(account)` after each
    blocking save: with auto, the interval chosen again from the account's costs (said when it changes); with a
    given interval, the Young/Daly one beside it, said once."""

    def __init__(self, given, log_interval: int, gpus: int, failure_rate_per_gpu_day: float):
        self.auto = given == "auto"
        # auto's first save ends the first logging window: the first step times and a save time to choose from.
        self.every: Optional[int] = log_interval if self.auto else given
        self.gpus, self.rate = gpus, failure_rate_per_gpu_day
        self.mtbf_s = mtbf_s(gpus, failure_rate_per_gpu_day)
        self.compared = False

    def due(self, iteration: int, last_saved: int) -> bool:
        if not self.every:
            return False
        if self.auto:
            return iteration - last_saved >= self.every
        return iteration % self.every == 0

    def measured(self, account: dict) -> None:
        choice = self.choose(account)
        if choice is not None:
            logger.info(choice[1])

    def choose(self, account: dict) -> Optional[Tuple[int, str]]:
        """(the interval, the line saying it) when there is something to say, from the account's measurements
        alone: the same account gives the same choice."""
        try:
            costs = costs_from_account(account)
        except ValueError:  # no step or save measured yet (a run that saves before its first step)
            return None
        best = interval_iterations(costs, self.mtbf_s)
        if self.auto:
            # Near its optimum the expected loss is flat: a change within a tenth is the measurements' noise.
            if abs(best - self.every) <= self.every / 10:
                return None
            previous, self.every = self.every, best
            return best, "save interval (--save-interval auto): " + describe_choice(
                costs, self.mtbf_s, self.gpus, self.rate, best, previous, "the previous interval")
        if self.compared or not self.every:
            return None
        self.compared = True
        return best, ("save interval: the Young/Daly interval would be " + describe_choice(
            costs, self.mtbf_s, self.gpus, self.rate, best, self.every, "--save-interval") + " (--save-interval auto "
            "chooses it)")
