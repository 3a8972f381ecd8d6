r"""Goodput at scale: the share of wall time whose steps end up in the model, predicted from a run's measured costs
for more GPUs, by a formula and by a simulation that checks it.

The costs are those of the trainer's goodput account (`costs_from_account`: the account a checkpoint keeps) or
stated ones. Failures are a Poisson process of rate `failure_rate_per_gpu_day` per GPU (Llama 3: 419 unexpected
interruptions in 54 days on 16,384 H100s, 4.7e-4 per GPU-day); each one loses the work since the last completed
save and the restart: `detection_s` (the launcher notices, timeouts), `startup_s`, the rendezvous at the job's size
(`rendezvous_node_s` per node), `load_s`.

Kept free of torch: the command's --help and the model answer at once.
"""

import dataclasses
import json
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

SECONDS_PER_DAY = 86400.0
# The job sizes' nodes (H100 and H200 nodes), for the rendezvous' cost.
GPUS_PER_NODE = 8
# How the simulation splits wall time; they sum to it.
CATEGORIES = ("startup", "load", "productive", "redone", "save", "failures")


@dataclasses.dataclass(frozen=True)
class RunCosts:
    """What one run's time goes to, in seconds: a productive training step; the blocking part of a checkpoint save;
    process start to first step, the load and the rendezvous excluded; the checkpoint load; from a failure to the
    restart's start; an attempt's rendezvous (the launchers meeting, the process groups) per node of the job.

    The rendezvous is assumed linear in the nodes: every agent joins through one store (torch's c10d rendezvous),
    one compare-and-set at a time, and every rank connects to the store for its process groups."""
    step_s: float
    save_s: float
    startup_s: float
    load_s: float
    detection_s: float = 60.0
    rendezvous_node_s: float = 0.0

    def startup_at(self, gpus: int) -> float:
        """An attempt's start to its first step on `gpus` GPUs, the load excluded: the start-up and the
        rendezvous of the job's nodes."""
        return self.startup_s + self.rendezvous_node_s * math.ceil(gpus / GPUS_PER_NODE)

    def restart_s(self, gpus: int) -> float:
        """R: what a failure costs on `gpus` GPUs besides the lost work."""
        return self.detection_s + self.startup_at(gpus) + self.load_s


def _number(mapping: dict, key: str, label: str) -> float:
    value = mapping.get(key) if isinstance(mapping, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"the account has no number {label} (found {value!r})")
    return float(value)


def costs_from_account(account: dict, detection_s: float = 60.0) -> RunCosts:
    """The costs of the run whose goodput account (as a checkpoint keeps it: `train_state["goodput"]`, or
    <save>/goodput.json) is `account`: seconds per productive step, per blocking save, per attempt's start-up (its
    rendezvous apart, per node: `rendezvous_s` over the attempts and the account's `nodes`; an account without them
    keeps the rendezvous in the start-up), per load (0 if it never loaded). Only the fields these need are read."""
    if not isinstance(account, dict):
        raise ValueError(f"the account is not a dict but {type(account).__name__}")
    seconds = {key: _number(account.get("seconds"), key, f"seconds[{key!r}]")
               for key in ("startup", "load", "productive", "save")}
    counts = {key: _number(account.get("counts"), key, f"counts[{key!r}]") for key in ("productive", "save", "load")}
    attempts = _number(account, "attempts", "'attempts'")
    rendezvous = _number(account, "rendezvous_s", "'rendezvous_s'") if "rendezvous_s" in account else 0.0
    nodes = _number(account, "nodes", "'nodes'") if "nodes" in account else 1.0
    for what, count in (("productive step", counts["productive"]), ("blocking save", counts["save"]),
                        ("attempt", attempts), ("node", nodes)):
        if count <= 0:
            raise ValueError(f"the account has no {what}: its count is {count:g}, so its cost is unknown")
    return RunCosts(step_s=seconds["productive"] / counts["productive"], save_s=seconds["save"] / counts["save"],
                    startup_s=(seconds["startup"] - rendezvous) / attempts,
                    load_s=seconds["load"] / counts["load"] if counts["load"] else 0.0, detection_s=detection_s,
                    rendezvous_node_s=rendezvous / attempts / nodes)


def read_account(path: str) -> dict:
    """The goodput account in `path`: a JSON file holding it, or a checkpoint (a root or an iteration folder)
    whose common state keeps it in `train_state["goodput"]`. OSError or ValueError naming the file otherwise."""
    if os.path.isfile(path):
        with open(path) as f:
            try:
                return json.load(f)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} is not valid JSON ({err})") from None
    from megatron_neobert.checkpoint.layout import resolve_checkpoint_dir
    from megatron_neobert.kernels import import_megatron_core

    import_megatron_core()  # quiet: this only reads the common state
    from megatron_neobert.checkpoint.state import read_common_state

    folder = resolve_checkpoint_dir(path)
    account = (read_common_state(folder).get("train_state") or {}).get("goodput")
    if account is None:
        raise ValueError(f"checkpoint {folder} has no goodput account (train_state['goodput']): saved by a trainer "
                         f"without one")
    return account


def mtbf_s(gpus: int, failure_rate_per_gpu_day: float) -> float:
    """Mean time between failures of a job on `gpus` GPUs, in seconds."""
    return SECONDS_PER_DAY / (failure_rate_per_gpu_day * gpus)


def expected_goodput(costs: RunCosts, gpus: int, tau: float, mtbf: float) -> float:
    r"""The share of wall time in steps that survive on `gpus` GPUs, saving after every `tau` seconds of work,
    failures every `mtbf` seconds on average (Young 1974, Daly 2006, to first order in 1/M).

    Without failures the run is cycles of tau of work and C (`save_s`) of saving: a share tau/(tau+C) is work. A
    failure costs the restart R (detection + start-up + rendezvous + load) and the work since the last completed save;
    it strikes uniformly within a cycle, so on average (tau+C)/2 of the cycle is lost. With 1/M failures per second of
    wall time, a share (R + (tau+C)/2)/M of it is lost:

        G(tau) = tau/(tau+C) * (1 - (R + (tau+C)/2) / M),   clipped to [0, 1].

    First order: failures during a restart, and the first start-up, are neglected (R, tau << M).
    """
    cycle = tau + costs.save_s
    return float(np.clip(tau / cycle * (1 - (costs.restart_s(gpus) + cycle / 2) / mtbf), 0.0, 1.0))


def optimal_interval_s(save_s: float, mtbf: float) -> float:
    r"""The tau maximising `expected_goodput`: for C, tau << M, G ~ 1 - C/tau - tau/(2M) - R/M, whose derivative
    C/tau^2 - 1/(2M) vanishes at tau = sqrt(2CM) (Young's interval)."""
    return math.sqrt(2 * save_s * mtbf)


def interval_iterations(costs: RunCosts, mtbf: float) -> int:
    """`optimal_interval_s` in whole steps (at least one): the trainer's --save-interval."""
    return max(1, round(optimal_interval_s(costs.save_s, mtbf) / costs.step_s))


@dataclasses.dataclass(frozen=True)
class SimulationResult:
    """Wall seconds by category (`CATEGORIES`, summing to the wall time) and the number of failures.

    productive: first computations of steps that are in the model at the end; redone: recomputations, after a
    restart, of steps whose first computation a failure lost; failures: detection, work lost since the last
    completed save, and the start-ups, loads and saves a failure cut short."""
    wall_s: float
    seconds: Dict[str, float]
    failures: int

    @property
    def goodput(self) -> float:
        """The wall time whose steps are in the model at the end: productive and redone. A failure's lost work is
        in `failures` already; its recomputation is the step's one computation that counts, as in the formula."""
        return (self.seconds["productive"] + self.seconds["redone"]) / self.wall_s


def simulate(costs: RunCosts, gpus: int, days: float, failure_rate_per_gpu_day: float, save_interval_iters: int,
             seed: int, async_save_s: Optional[float] = None) -> SimulationResult:
    """A run of `days` of wall time on `gpus` GPUs saving every `save_interval_iters` steps, failures drawn from
    `numpy.random.default_rng(seed)`. Each attempt starts up, loads the last checkpoint (none before the first save),
    then repeats save_interval_iters steps and a blocking save until a failure or the end. A failure loses the work
    and the save since the last completed save and, after `detection_s`, a new attempt begins; the next failure is
    drawn from there (memoryless: one in the detection window is caught by the same restart). The end of the run is
    no failure: its last steps count. `async_save_s`: the blocking part of an asynchronous save instead of
    `save_s` (its background write assumed done before the next save).

    One pass per attempt: the cycles between two failures are counted, never stepped through."""
    horizon = days * SECONDS_PER_DAY
    rate = gpus * failure_rate_per_gpu_day / SECONDS_PER_DAY
    rng = np.random.default_rng(seed)
    save_s = costs.save_s if async_save_s is None else async_save_s
    startup_s = costs.startup_at(gpus)
    work = save_interval_iters * costs.step_s
    cycle = work + save_s
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    t = saved = reached = 0.0  # wall clock; work seconds in the last completed checkpoint; furthest work reached
    failures = 0
    failure_at = rng.exponential(1 / rate) if rate > 0 else math.inf
    while t < horizon:
        failed = failure_at < horizon
        stop = min(failure_at, horizon)
        preparation = [("startup", startup_s)] + ([("load", costs.load_s)] if saved > 0 else [])
        for name, duration in preparation:
            if t + duration >= stop:
                seconds["failures" if failed else name] += stop - t
                t = stop
                break
            seconds[name] += duration
            t += duration
        else:
            cycles = math.floor((stop - t) / cycle)
            rest = (stop - t) - cycles * cycle  # into the cycle the stop cuts short
            kept = cycles * work + (0.0 if failed else min(rest, work))
            seconds["save"] += cycles * save_s + (0.0 if failed else max(0.0, rest - work))
            seconds["failures"] += rest if failed else 0.0
            redone = min(kept, max(0.0, reached - saved))
            seconds["redone"] += redone
            seconds["productive"] += kept - redone
            reached = max(reached, saved + cycles * work + min(rest, work))
            saved += cycles * work
            t = stop
        if not failed:
            break
        failures += 1
        detection = min(costs.detection_s, horizon - t)
        seconds["failures"] += detection
        t += detection
        failure_at = t + rng.exponential(1 / rate)
    return SimulationResult(wall_s=horizon, seconds=seconds, failures=failures)


def mean_goodput(costs: RunCosts, gpus: int, days: float, failure_rate_per_gpu_day: float, save_interval_iters: int,
                 seeds: Sequence[int], async_save_s: Optional[float] = None) -> Tuple[float, float]:
    """(goodput, failures) of `simulate`, each the mean over `seeds`."""
    runs = [simulate(costs, gpus, days, failure_rate_per_gpu_day, save_interval_iters, seed, async_save_s)
            for seed in seeds]
    return float(np.mean([r.goodput for r in runs])), float(np.mean([r.failures for r in runs]))


def best_interval(costs: RunCosts, gpus: int, days: float, failure_rate_per_gpu_day: float, seeds: Sequence[int],
                  async_save_s: Optional[float] = None, points: int = 15) -> Tuple[int, float, int]:
    """(save interval in steps with the best simulated goodput, that goodput, the formula's interval in steps).

    The grid spans 0.25x to 4x the formula's interval geometrically; every point sees the same failures (the same
    `seeds`: common random numbers), so that the comparison is not drowned in the draws' noise."""
    effective = costs if async_save_s is None else dataclasses.replace(costs, save_s=async_save_s)
    formula = interval_iterations(effective, mtbf_s(gpus, failure_rate_per_gpu_day))
    grid = sorted({max(1, round(formula * f)) for f in np.geomspace(0.25, 4.0, points)})
    scores = [mean_goodput(costs, gpus, days, failure_rate_per_gpu_day, iters, seeds, async_save_s)[0]
              for iters in grid]
    best = int(np.argmax(scores))
    return grid[best], scores[best], formula


@dataclasses.dataclass(frozen=True)
class ScalingRow:
    """One job size: the formula's save interval and goodput, the simulation's at that interval and at its own best,
    and the simulated goodput with an asynchronous save (at its own formula interval) and with restarts twice as
    fast (detection, start-up, rendezvous and load halved)."""
    gpus: int
    mtbf_h: float
    failures: float
    interval_min: float
    interval_iters: int
    formula_goodput: float
    simulated_goodput: float
    best_iters: int
    best_goodput: float
    async_iters: int
    async_goodput: float
    fast_restart_goodput: float


def scaling_table(costs: RunCosts, gpus: Sequence[int], days: float, failure_rate_per_gpu_day: float,
                  seeds: Sequence[int], async_save_s: float) -> List[ScalingRow]:
    """A `ScalingRow` per job size in `gpus`, the costs the same for each but the rendezvous, per node (weak scaling:
    the tokens per GPU per step, hence the step time, stay constant; the checkpoint's size does not grow with the
    job)."""
    fast_restart = dataclasses.replace(costs, detection_s=costs.detection_s / 2, startup_s=costs.startup_s / 2,
                                       load_s=costs.load_s / 2, rendezvous_node_s=costs.rendezvous_node_s / 2)
    rows = []
    for n in gpus:
        mtbf = mtbf_s(n, failure_rate_per_gpu_day)
        iters = interval_iterations(costs, mtbf)
        simulated, failures = mean_goodput(costs, n, days, failure_rate_per_gpu_day, iters, seeds)
        best_iters, best, _ = best_interval(costs, n, days, failure_rate_per_gpu_day, seeds)
        async_iters = interval_iterations(dataclasses.replace(costs, save_s=async_save_s), mtbf)
        rows.append(ScalingRow(
            gpus=n, mtbf_h=mtbf / 3600, failures=failures, interval_min=iters * costs.step_s / 60,
            interval_iters=iters, formula_goodput=expected_goodput(costs, n, iters * costs.step_s, mtbf),
            simulated_goodput=simulated, best_iters=best_iters, best_goodput=best, async_iters=async_iters,
            async_goodput=mean_goodput(costs, n, days, failure_rate_per_gpu_day, async_iters, seeds, async_save_s)[0],
            fast_restart_goodput=mean_goodput(fast_restart, n, days, failure_rate_per_gpu_day, iters, seeds)[0]))
    return rows


def format_markdown(rows: Sequence[ScalingRow], async_save_s: float) -> str:
    """The rows as a Markdown table, goodputs in percent."""
    header = ["GPUs", "MTBF", "failures", "save interval (formula)", "goodput (formula)", "goodput (simulated)",
              "best interval (simulated)", f"async save ({async_save_s:g} s blocking)", "restarts 2x faster"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        cells = [f"{r.gpus:,}", f"{r.mtbf_h:,.1f} h", f"{r.failures:,.1f}",
                 f"{r.interval_min:,.1f} min ({r.interval_iters:,} steps)", f"{100 * r.formula_goodput:.2f}%",
                 f"{100 * r.simulated_goodput:.2f}%", f"{r.best_iters:,} steps: {100 * r.best_goodput:.2f}%",
                 f"{100 * r.async_goodput:.2f}% ({r.async_iters:,} steps)", f"{100 * r.fast_restart_goodput:.2f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
