r"""Goodput at scale from a run's measured costs: for each job size, the save interval that maximises it and the
goodput there, by the first-order formula (Young/Daly) and by a seeded simulation of the run's failures
(`megatron_neobert.training.resilience.goodput_model`; docs/training.md, Goodput at scale).

    # the costs a run measured (its checkpoint's goodput account, or a JSON file holding the account)
    python -m megatron_neobert.cli.goodput_model --account ckpt --markdown
    # stated costs, in seconds
    python -m megatron_neobert.cli.goodput_model --step-s 0.125 --save-s 10 --startup-s 90 --load-s 20 \
        --rendezvous-node-s 0.1
"""

import dataclasses
import sys
from typing import List, Optional

from megatron_neobert.flags import ArgumentParser, add_flags, setting
from megatron_neobert.defaults import LLAMA3_FAILURES_PER_GPU_DAY
from megatron_neobert.training.resilience.goodput_model import (GPUS_PER_NODE, RunCosts, costs_from_account,
                                                                format_markdown, read_account, scaling_table)

COST_FLAGS = {"step_s": "--step-s", "save_s": "--save-s", "startup_s": "--startup-s", "load_s": "--load-s"}
OPTIONAL_COSTS = ("rendezvous_node_s",)  # 0 when stated costs leave it out: their start-up holds the rendezvous


@dataclasses.dataclass(frozen=True)
class GoodputFlags:
    account: Optional[str] = setting(None, "the costs measured by a run: its checkpoint (a root or an iteration "
                                           "folder), or a JSON file holding its goodput account")
    step_s: Optional[float] = setting(None, "seconds of one training step (default: the account's)")
    save_s: Optional[float] = setting(None, "seconds of the blocking part of a save (default: the account's)")
    startup_s: Optional[float] = setting(None, "seconds from process start to the first step, the load and the "
                                               "rendezvous excluded (default: the account's)")
    load_s: Optional[float] = setting(None, "seconds of a checkpoint load (default: the account's)")
    rendezvous_node_s: Optional[float] = setting(
        None, f"seconds of an attempt's rendezvous (launchers and process groups) per node of {GPUS_PER_NODE} GPUs, "
              "assumed linear in the nodes (default: the account's rendezvous_s per attempt and node; 0 with stated "
              "costs)")
    detection_s: float = setting(60.0, "seconds from a failure to the restart's start (the launcher notices it)")
    gpus: List[int] = setting([64, 1024, 16384], "job sizes, one row each")
    days: float = setting(54.0, "wall time of the run")
    failure_rate_per_gpu_day: float = setting(LLAMA3_FAILURES_PER_GPU_DAY,
                                              "failures per GPU per day (Llama 3: 419 in 54 days on 16,384 H100s)")
    seed: int = setting(0, "the simulation's first seed (0 by default)")
    seeds: int = setting(5, "simulations averaged per value (seeds --seed, --seed + 1, ...)")
    async_save_s: Optional[float] = setting(None, "blocking seconds of an asynchronous save (default: --save-s / 10)")
    markdown: bool = setting(False, "print the table as Markdown (default: a line per job size)")


def main(argv=None) -> int:
    """Prints the costs used, then a row per job size; bad input is one `error:` line naming the flag or file, with
    argparse's exit status 2."""
    p = ArgumentParser(prog="python -m megatron_neobert.cli.goodput_model", description=__doc__)
    add_flags(p, GoodputFlags)
    args = p.parse_args(argv)
    given = {name: getattr(args, name) for name in (*COST_FLAGS, *OPTIONAL_COSTS) if getattr(args, name) is not None}
    if args.account is not None:
        try:
            measured = costs_from_account(read_account(args.account), args.detection_s)
        except (OSError, ValueError) as err:  # no such file, not a checkpoint, no account, a field missing
            p.error(f"--account {args.account}: {err}")
        costs = dataclasses.replace(measured, **given)
    elif all(name in given for name in COST_FLAGS):
        costs = RunCosts(**given, detection_s=args.detection_s)
    else:
        p.error(f"give --account, or all of {', '.join(COST_FLAGS.values())} (missing: "
                f"{', '.join(flag for name, flag in COST_FLAGS.items() if name not in given)})")
    for name, value in dataclasses.asdict(costs).items():
        if value < 0 or (name == "step_s" and value == 0):  # a step of no time would make every interval endless
            from_account = args.account is not None and name not in given and name != "detection_s"
            source = f"--account {args.account} ({name})" if from_account else f"--{name.replace('_', '-')}"
            p.error(f"{source}: {value:g} s is not a {'positive' if name == 'step_s' else 'non-negative'} time")
    if args.seeds < 1 or args.days <= 0 or args.failure_rate_per_gpu_day <= 0 or min(args.gpus) < 1:
        p.error("--seeds, --days, --failure-rate-per-gpu-day and --gpus must be positive")
    async_save_s = costs.save_s / 10 if args.async_save_s is None else args.async_save_s
    print(f"costs: step {costs.step_s:g} s, save {costs.save_s:g} s (async: {async_save_s:g} s blocking), start-up "
          f"{costs.startup_s:g} s, load {costs.load_s:g} s, detection {costs.detection_s:g} s, rendezvous "
          f"{costs.rendezvous_node_s:g} s per node of {GPUS_PER_NODE} GPUs; {args.days:g} days, "
          f"{args.failure_rate_per_gpu_day:g} failures per GPU-day, {args.seeds} seeds from {args.seed}")
    rows = scaling_table(costs, args.gpus, args.days, args.failure_rate_per_gpu_day,
                         range(args.seed, args.seed + args.seeds), async_save_s)
    if args.markdown:
        print(format_markdown(rows, async_save_s))
    else:
        for r in rows:
            print(f"{r.gpus} GPUs: MTBF {r.mtbf_h:.1f} h, save every {r.interval_iters} steps ({r.interval_min:.1f} "
                  f"min): goodput {r.formula_goodput:.2%} (formula), {r.simulated_goodput:.2%} (simulated); best "
                  f"simulated interval {r.best_iters} steps ({r.best_goodput:.2%}); async save {r.async_goodput:.2%} "
                  f"every {r.async_iters} steps; restarts 2x faster {r.fast_restart_goodput:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
