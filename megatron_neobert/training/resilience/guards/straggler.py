"""A rank that stays slow: each rank's compute time measured and exchanged every log interval, for the straggler rule
(`rules.StragglerRule`) to judge on rank 0; with --straggler-exit-intervals its host's part of the job ends.

In a synchronous job one slow rank makes every step slow: the others wait for it in the gradient reduction. So a
rank's own speed is its compute time, the step less its wait for its peers, and that wait is measured around the
data-parallel gradient reduction (megatron-core's finalize_model_grads, the step's first collective that every rank
joins after its forward and backward: a fast rank waits there for the slowest, the slowest hardly at all; the
collectives after it find the ranks already aligned). Slowness outside the step (input, a sleep, a throttled host)
shows the same way: the others wait for it in the next step's reduction.

The exchange, bounded in time: at each log interval's end every rank writes its compute time per step into the
rendezvous store (one key, its previous one deleted), and rank 0 reads the previous interval's keys. Every live rank
wrote those before it joined this interval's gradient reductions with rank 0, so rank 0 finds them at once; a frozen
rank's key is missing and rank 0 waits READ_TIMEOUT_S for it, never a collective's timeout. The report is thus one
interval late, and costs each rank two store round trips per interval (rank 0 one read of all keys): no collective.
Under torchrun the store is torchrun's: a store that is gone is a torchrun that died, and the rank ends as the
launcher watch ends it (`launcher.LauncherWatch.exit_if_gone`).

Intervals holding a save or a validation, and the first one (start-up, first compilations), are not judged: a one-off
pause is not a straggler. The rule judges windows of at least 8 steps (`rules.StragglerRule`: short log intervals
combined), so that a busy machine's bursts of a second or two name no straggler at any --log-interval.
"""

import contextlib
import dataclasses
import datetime
import json
import logging
import socket
import statistics
import time
from typing import List, Optional, Tuple

import torch

from megatron_neobert.training.config.settings import Settings
from megatron_neobert.training.resilience.guards.launcher import LauncherWatch
from megatron_neobert.training.resilience.guards.rules import RankTime, StragglerRule, slowest

logger = logging.getLogger(__name__)

READ_TIMEOUT_S = 2.0  # the keys are in the store before rank 0 reads them: only a frozen rank's is ever waited for
_DRAIN_KEY = "drain"


@dataclasses.dataclass(frozen=True)
class Interval:
    """A log interval as rank 0 saw it."""

    first: int  # its first iteration
    last: int
    step_s: float  # rank 0's wall time per step
    flops_per_rank: float  # per step


def minmax_report(times: List[RankTime], flops_per_rank: float, count: int) -> List[str]:
    """Megatron-LM's --log-straggler lines: min and max compute time (Rtt) and estimated TFLOP/s (Etpt) with their
    ranks; with --straggler-minmax-count above 1, the `count` ranks of lowest and highest throughput."""
    by_time = sorted(times, key=lambda t: t.compute_s)
    etpt = {t.rank: flops_per_rank / t.compute_s / 1e12 if t.compute_s > 0 else 0.0 for t in times}
    fastest, slowest_rank = by_time[0], by_time[-1]
    lines = [f" MnRtt/Rnk: {fastest.compute_s * 1000:.2f}ms/{fastest.rank} | MxRtt/Rnk: "
             f"{slowest_rank.compute_s * 1000:.2f}ms/{slowest_rank.rank} | MnEtpt/Rnk: "
             f"{etpt[slowest_rank.rank]:.2f}TF/{slowest_rank.rank} | MxEtpt/Rnk: {etpt[fastest.rank]:.2f}TF/"
             f"{fastest.rank}"]
    if count > 1:
        lines += [f"^^^^ Bottom {count} Ranks with lowest  Etpt(TF): "
                  + ", ".join(f"{etpt[t.rank]:.2f}/{t.rank}" for t in reversed(by_time[-count:])),
                  f"^^^^ Top    {count} Ranks with highest Etpt(TF): "
                  + ", ".join(f"{etpt[t.rank]:.2f}/{t.rank}" for t in by_time[:count])]
    return lines


class StragglerDetector:
    """This rank's measurement and exchange; over the model chunks' gradient reduction (`config`: their megatron-core
    config, whose finalize_model_grads_func it times). Every rank calls `interval_end` at each log interval's end,
    `pause` when a save or validation falls in the interval; rank 0 judges with the rule and reports through `log`
    (scalars) and `account` (the time the straggler cost). `launcher`: the guards' watch of torchrun."""

    def __init__(self, settings: Settings, config, log, account, launcher: LauncherWatch):
        self.faults, self.options, self.log, self.account = settings.faults, settings.logging, log, account
        self.launcher = launcher
        self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self.host = socket.gethostname()
        # The process group's store: under torchrun one per attempt, so a restarted attempt starts without the keys
        # (a drain decided) of the one before.
        self.store = torch.distributed.PrefixStore("straggler", torch.distributed.distributed_c10d._get_default_store())
        self.report_on = settings.logging.log_straggler and not settings.logging.disable_straggler_on_startup
        self.waited, self.judged = 0.0, False  # the first interval (start-up) is not judged
        self.device_waits: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []  # this interval's, on a GPU
        self.keys: List[str] = []  # this rank's keys still in the store
        self.interval: Optional[Interval] = None  # rank 0: the interval whose times the next one reads
        self.rule = StragglerRule(self.faults.straggler_threshold, self.faults.straggler_intervals,
                                  self.faults.straggler_exit_intervals)
        reduce = config.finalize_model_grads_func
        config.finalize_model_grads_func = lambda *args, **kwargs: self._timed_wait(reduce, *args, **kwargs)

    def _timed_wait(self, reduce, *args, **kwargs):
        if not torch.cuda.is_available():
            began = time.perf_counter()
            result = reduce(*args, **kwargs)
            self.waited += time.perf_counter() - began
            return result
        # The wait is the device's (its work queued so far is this rank's compute): timed by events on the stream,
        # read at the interval's end, so that the step is not synchronised (a synchronisation after the reduction
        # would leave the device idle while the optimizer's kernels are launched).
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record()
        result = reduce(*args, **kwargs)
        after.record()
        self.device_waits.append((before, after))
        return result

    def _waited_s(self) -> float:
        """This interval's wait in the gradient reductions, in seconds."""
        if self.device_waits:
            self.device_waits[-1][1].synchronize()  # the last reduction done: every earlier one is, on one stream
        return self.waited + sum(before.elapsed_time(after) for before, after in self.device_waits) / 1000

    def pause(self) -> None:
        """A save or a validation in this interval: it is not judged."""
        self.judged = False

    def interval_end(self, first: int, last: int, elapsed: float, flops: float) -> Optional[str]:
        """The interval of iterations `first`..`last` ended after `elapsed` seconds and `flops` (all ranks): publish
        this rank's time, and on rank 0 judge the interval before. Returns the host to drain, once rank 0 has decided
        it (every rank learns it at the same interval's end)."""
        steps = last - first + 1
        with self._torchruns_store():
            drain = self._drain_decided(last)
            key = f"{last}/{self.rank}"
            self.store.set(key, json.dumps([(elapsed - self._waited_s()) / steps, self.judged, self.host]))
            self.keys.append(key)
            if len(self.keys) > 2:  # rank 0 has read it: an interval ago
                self.store.delete_key(self.keys.pop(0))
            if self.rank == 0:
                if self.interval is not None:
                    self._judge(self.interval, last)
                self.interval = Interval(first, last, elapsed / steps, flops / steps / self.world)
        self.waited, self.judged, self.device_waits = 0.0, True, []
        return drain

    @contextlib.contextmanager
    def _torchruns_store(self):
        """Around the store's use: under torchrun the store is torchrun's, and a broken pipe to it means that torchrun
        died (kill -9): the rank ends with the launcher watch's line, as it would a moment later, not in a
        traceback."""
        try:
            yield
        except torch.distributed.DistNetworkError:
            self.launcher.exit_if_gone()
            raise  # torchrun is there: the store failed otherwise

    def _drain_decided(self, last: int) -> Optional[str]:
        """The host rank 0 decided to drain at an earlier interval's end: every rank has its key by the next end
        (a rank behind may see it at the same end as rank 0: it waits for the next, as rank 0 does)."""
        if not self.faults.straggler_exit_intervals or not self.store.check([_DRAIN_KEY]):
            return None
        decided_at, host = self.store.get(_DRAIN_KEY).decode().split(" ", 1)
        return host if last > int(decided_at) else None

    def _read(self, last: int) -> Tuple[List[RankTime], bool]:
        """The ranks' times of the interval ending at `last` (those that came within READ_TIMEOUT_S), and whether
        every rank judged it."""
        keys = [f"{last}/{rank}" for rank in range(self.world)]
        try:
            self.store.wait(keys, datetime.timedelta(seconds=READ_TIMEOUT_S))
            present = keys
        except torch.distributed.DistStoreError:  # the wait timed out: a frozen rank (the watchdog's host check
            # names it); the others are read
            present = [key for key in keys if self.store.check([key])]
        values = [json.loads(value) for value in self.store.multi_get(present)] if present else []
        times = [RankTime(int(key.split("/")[1]), host, compute) for key, (compute, _, host) in zip(present, values)]
        return times, len(present) == self.world and all(judged for _, judged, _ in values)

    def _judge(self, interval: Interval, now: int) -> None:
        """Judge `interval` at the end of the interval ending at `now`."""
        times, judged = self._read(interval.last)
        if len(times) >= 2:
            compute = sorted(t.compute_s for t in times)
            self.log.scalars(interval.last, [
                ("rank-time-min", compute[0]), ("rank-time-median", statistics.median(compute)),
                ("rank-time-max", compute[-1]), ("slowest-rank", slowest(times)[0].rank)])
            if self.report_on:
                for line in minmax_report(times, interval.flops_per_rank, self.options.straggler_minmax_count):
                    logger.info(line)
        if not judged:
            self.rule.skip()
            return
        verdict = self.rule.interval(interval.first, interval.last, interval.step_s, times)
        for line in verdict.lines:
            logger.info(line)
        self.account.straggler_s += verdict.straggler_s
        if verdict.drain:
            self.store.set(_DRAIN_KEY, f"{now} {verdict.drain}")
