"""Where a run's start-up goes: a tiny run on 2 ranks (torchrun, CPU processes over gloo where there is no GPU),
part by part as its start-up line says, from scratch and resumed from its checkpoint; with --baseline, the same runs
of another checkout alternated with this one's, side by side with the ratio of the medians. Beside them, the imports
of torch, megatron-core and transformers, each timed in a fresh process after those before it.

    python tools/benchmark_startup.py [--nproc 2] [--repeats 3] [--baseline /path/to/other/checkout]
"""

import dataclasses
import os
import re
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from megatron_neobert.flags import ArgumentParser, add_flags, setting

STARTUP_LINE = re.compile(r"^start-up ([\d.]+) s to the first step: (.*); first step ([\d.]+) s$", re.M)
IMPORTS = ("torch", "megatron.core", "transformers")
THIS_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class StartupBenchmarkFlags:
    nproc: int = setting(2, "ranks of the tiny run")
    repeats: int = setting(3, "runs of each kind (the median is shown: the cores may be shared)")
    baseline: Optional[str] = setting(None, "another checkout whose runs are alternated with this one's (its "
                                            "megatron_neobert first on PYTHONPATH)")
    work_dir: Optional[str] = setting(None, "where the data and checkpoints go (default: a temporary folder)")


def startup_parts(line_source: str) -> Dict[str, float]:
    """{part: seconds} of the start-up line in a run's output, with "total" and "first step"."""
    found = STARTUP_LINE.search(line_source)
    if found is None:
        raise RuntimeError(f"no start-up line in the run's output:\n{line_source[-3000:]}")
    # A part's name may hold a comma: each part ends at its seconds.
    parts = {name: float(seconds) for name, seconds in re.findall(r"(.+?) (\d+\.\d+) s(?:, |$)", found.group(2))}
    return {**parts, "total": float(found.group(1)), "first step": float(found.group(3))}


def tiny_run(checkout: str, data_prefix: str, save: str, iterations: int, nproc: int, port: int) -> str:
    """The output of a tiny run to `iterations` (resuming from `save` when it holds a checkpoint)."""
    from megatron_neobert.data.assets import SAMPLE_TOKENIZER

    env = {**os.environ, "NEOBERT_ALLOW_CPU": "1", "PYTHONPATH": checkout}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
               str(port), "-m", "megatron_neobert.pretrain", "--model-preset", "neobert-tiny", "--num-layers", "2",
               "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
               "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", SAMPLE_TOKENIZER,
               "--data-path", data_prefix, "--split", "98,2,0", "--num-workers", "0", "--seq-length", "64",
               "--micro-batch-size", "4", "--global-batch-size", "8", "--lr", "1e-3", "--lr-warmup-iters", "0",
               "--train-iters", str(iterations), "--log-interval", "1", "--save", save, "--load", save]
    # In the checkout: `python -m` puts the working directory first on sys.path, before PYTHONPATH.
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=checkout)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def import_times(checkout: str) -> Dict[str, float]:
    """Seconds of each of IMPORTS in a fresh process, each after those before it (as a rank imports them)."""
    code = ("import sys, time\nfor name in sys.argv[1:]:\n    began = time.perf_counter()\n    __import__(name)\n"
            "    print(name, time.perf_counter() - began)\n")
    env = {**os.environ, "PYTHONPATH": checkout}
    out = subprocess.run([sys.executable, "-c", code, *IMPORTS], env=env, capture_output=True, text=True,
                         check=True, cwd=checkout).stdout
    return {name: float(seconds) for name, seconds in (line.split() for line in out.splitlines())}


def measure(checkouts: List[str], args, work: str) -> Dict[str, Dict[str, List[float]]]:
    """{checkout: {"fresh: part" or "resumed: part" or "import X": [seconds of each repeat]}}, the checkouts'
    runs alternated so that a change in the machine's load falls on both."""
    from megatron_neobert.cli import import_megatron_core_quietly
    from megatron_neobert.data.assets import SAMPLE_CORPUS, SAMPLE_TOKENIZER
    from megatron_neobert.data.preprocessing.preprocess import preprocess_data

    import_megatron_core_quietly()
    data_prefix = os.path.join(work, "data", "sample")
    preprocess_data([SAMPLE_CORPUS], data_prefix, json_keys=["content"], tokenizer_model=SAMPLE_TOKENIZER,
                    progress=False)
    figures: Dict[str, Dict[str, List[float]]] = {c: {} for c in checkouts}
    for repeat in range(args.repeats):
        for index, checkout in enumerate(checkouts):
            save = os.path.join(work, f"ckpt-{index}-{repeat}")
            for kind, iterations in (("fresh", 2), ("resumed", 3)):
                output = tiny_run(checkout, data_prefix + "_content_document", save, iterations, args.nproc,
                                  29700 + index)
                for part, seconds in startup_parts(output).items():
                    figures[checkout].setdefault(f"{kind}: {part}", []).append(seconds)
            for name, seconds in import_times(checkout).items():
                figures[checkout].setdefault(f"import {name}", []).append(seconds)
    return figures


def format_table(figures: Dict[str, Dict[str, List[float]]], current: str, baseline: Optional[str]) -> str:
    rows = ["| part | this checkout (s) |" + (" baseline (s) | ratio |" if baseline else ""),
            "| --- | --- |" + (" --- | --- |" if baseline else "")]
    for part, values in figures[current].items():
        median = statistics.median(values)
        row = f"| {part} | {median:.2f} |"
        if baseline:
            base = statistics.median(figures[baseline].get(part, [float("nan")]))
            row += f" {base:.2f} | {median / base:.2f} |" if base else f" {base:.2f} | n/a |"
        rows.append(row)
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python tools/benchmark_startup.py", description=__doc__)
    add_flags(parser, StartupBenchmarkFlags)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work_dir or scratch
        baseline = os.path.abspath(args.baseline) if args.baseline else None
        figures = measure([THIS_CHECKOUT] + ([baseline] if baseline else []), args, work)
    print(format_table(figures, THIS_CHECKOUT, baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
