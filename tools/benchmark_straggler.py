"""The straggler detector's cost: tiny runs on N ranks (CPU processes over gloo where there is no GPU; mock data), with
the detector off (--no-straggler-detection) and on, alternated; each run's mean step time (the goodput account's
productive seconds per step), and with the detector on the time of its work at each log interval's end (a store write
and delete on every rank, rank 0's read of all ranks' times), as a ratio of a step and per step at --log-interval.

    python tools/benchmark_straggler.py [--nproc 2] [--repeats 3] [--iterations 60] [--log-interval 100]
"""

import dataclasses
import statistics
import sys
import time

from megatron_neobert.flags import ArgumentParser, add_flags, setting


@dataclasses.dataclass(frozen=True)
class StragglerBenchmarkFlags:
    nproc: int = setting(2, "ranks of each run")
    repeats: int = setting(3, "runs of each kind, alternated (the median is shown: the cores may be shared)")
    iterations: int = setting(60, "steps of each run")
    measured_interval: int = setting(
        2, "the runs' --log-interval: short, so that each run ends many intervals and the detector's work is timed "
           "often")
    log_interval: int = setting(100, "the --log-interval the cost per step is given at (the recipe's and "
                                     "Megatron-LM's scripts')")


def run_argv(flags: StragglerBenchmarkFlags, detector: bool) -> list:
    from megatron_neobert.data.assets import SAMPLE_TOKENIZER

    return ["--model-preset", "neobert-tiny", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads",
            "4", "--ffn-hidden-size", "128", "--seq-length", "64", "--mock-data", "--tokenizer-model",
            SAMPLE_TOKENIZER, "--micro-batch-size", "2", "--global-batch-size", str(4 * flags.nproc),
            "--train-iters", str(flags.iterations), "--log-interval", str(flags.measured_interval),
            "--lr-warmup-iters", "2", "--eval-interval", "0", "--num-workers", "0"] + \
        ([] if detector else ["--no-straggler-detection"])


def timed_run(argv: list) -> tuple:
    """(mean step time, [seconds of each of the detector's interval ends]) of a run on this rank."""
    from megatron_neobert.parallel.cpu import cpu_execution
    from megatron_neobert.training.config.arguments import parse_settings
    from megatron_neobert.training.engine.entry import train
    from megatron_neobert.training.resilience.guards.straggler import StragglerDetector

    ends, interval_end = [], StragglerDetector.interval_end

    def timed(self, *args, **kwargs):
        began = time.perf_counter()
        drain = interval_end(self, *args, **kwargs)
        ends.append(time.perf_counter() - began)
        return drain
    StragglerDetector.interval_end = timed
    with cpu_execution():
        account = train(parse_settings(argv))["goodput"]
    return account["seconds"]["productive"] / account["counts"]["productive"], ends


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python tools/benchmark_straggler.py", description=__doc__)
    add_flags(parser, StragglerBenchmarkFlags)
    flags = StragglerBenchmarkFlags(**vars(parser.parse_args(argv)))
    from megatron_neobert.parallel.launch import run_on_ranks

    steps = {False: [], True: []}
    rank0_ends, other_ends = [], []
    for _ in range(flags.repeats):
        for detector in (False, True):
            ranks = run_on_ranks(timed_run, flags.nproc, run_argv(flags, detector))
            steps[detector].append(statistics.mean(step for step, _ in ranks))
            rank0_ends += ranks[0][1][1:]  # the first interval end has nothing to read
            other_ends += [end for _, ends in ranks[1:] for end in ends]
    step = statistics.median(steps[True])
    cost = statistics.median(rank0_ends)
    print(f"{flags.nproc} ranks, {flags.repeats} runs of {flags.iterations} steps each way (median)")
    print(f"step time, detector off: {1000 * statistics.median(steps[False]):.2f} ms; "
          f"on: {1000 * step:.2f} ms ({statistics.median(steps[True]) / statistics.median(steps[False]):.3f}x)")
    print(f"the detector's work at an interval's end: rank 0 {1000 * cost:.3f} ms, the other ranks "
          f"{1000 * statistics.median(other_ends):.3f} ms (median of {len(rank0_ends)} and {len(other_ends)})")
    print(f"cost per interval: {100 * cost / step:.2f}% of a step; per step at --log-interval {flags.log_interval}: "
          f"{100 * cost / step / flags.log_interval:.4f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
