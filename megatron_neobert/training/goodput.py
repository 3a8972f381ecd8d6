"""The run's account of wall time: where every second since the job's first start went, and its goodput (the share
spent on steps that count).

Categories (seconds, each measured where it happens, never inferred from step counts):
- startup: this attempt's process start to its first step (imports, input checks, process groups, model, optimizer,
  data), less the checkpoint load;
- load: the checkpoint load;
- productive: training steps done for the first time;
- redone: steps a restarted attempt does again because the failed attempt did them after its last checkpoint (in-job
  restarts, where torchrun's store kept the failed attempt's progress); their first doing stays productive, so that
  each lost step is charged once, as Young/Daly's expected loss counts it;
- skipped: steps whose loss or gradients were not finite (no update);
- evaluation: validations;
- save: the blocking part of checkpoint saves (all of a synchronous save, the staging of an --async-save, and
  waiting for a background write to finish);
- failures: between two attempts: from the failed attempt's last step to the next attempt's process start (the
  failure's detection, the restart or the requeue). Where the failed attempt's progress is unknown (torchrun's store
  went with it, a requeue), from the end of the checkpoint the next attempt loads: the steps done after it are
  lost in this row then, and not counted as redone;
- other: the rest (logging, the stop agreement, the end of the run).

An --async-save's background write overlaps training: it is kept apart ("async_save_background") and is no part of
the wall time. The account is saved in each checkpoint (`snapshot`) and continued by a run that resumes from it, so
goodput is that of the job since its first start, across restarts and requeues.
"""

import time
from typing import Dict, List, Optional, Tuple


# The wall-time categories, in the end-of-run table's order, with their rows' names.
CATEGORIES = {"startup": "start-up", "load": "checkpoint load", "productive": "productive steps",
              "redone": "steps redone after a restart", "skipped": "skipped steps (non-finite)",
              "evaluation": "evaluation", "save": "checkpoint save (blocking)",
              "failures": "between attempts (detection, restart)", "other": "other"}
COUNTED = ("productive", "redone", "skipped", "evaluation", "save", "load")


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

    def lap(self, part: str, category: str = "startup") -> None:
        """The start-up's `part` ends now (it began where the last one ended): its time goes to `category`."""
        now = time.time()
        self.startup_parts.append((part, now - self.last_lap))
        self.add(category, now - self.last_lap)
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
        for name in CATEGORIES:
            self.seconds[name] += saved["seconds"][name]
        for name in COUNTED:
            self.counts[name] += saved["counts"][name]
        self.async_save_background += saved["seconds"].get("async_save_background", 0.0)
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
                "seconds": {**self._with_other(now), "async_save_background": self.async_save_background},
                "counts": dict(self.counts)}

    def scalars(self, now: float) -> List[Tuple[str, float]]:
        """TensorBoard's goodput/ tags: the goodput and each category's seconds so far."""
        return [("goodput/goodput", self.goodput(now))] + \
            [(f"goodput/{name}_s", value) for name, value in self._with_other(now).items()] + \
            [("goodput/async_save_background_s", self.async_save_background)]

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
        return "\n".join(lines)
