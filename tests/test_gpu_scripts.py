"""The two scripts a GPU host runs write their results to $OUT alone, a few files, and leave partial results when a
time limit stops them: tests/gpu/run.sh (its GPU tests skip on a CPU) stopped by SIGTERM as `timeout` sends it, and
examples/benchmark_gpu.sh's quick run in its CPU mode. Each runs in a copy of the checkout, which must come out
unchanged."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the scripts, pytest and the benchmark in subprocesses

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 16 * 1024 * 1024


def copy_of_the_checkout(folder: Path) -> Path:
    """The tracked and untracked-not-ignored files, as a GPU host receives the tree."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes((ROOT / name).read_bytes())
    return folder


def listing(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")}


def results_of(out: Path) -> dict:
    """{name: size} of what a script left in `out`, checked against what a remote runner returns: at most 8
    files, at most 2 folders down, each at most 16 MiB."""
    found = {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*") if p.is_file()}
    assert len(found) <= 8 and all(name.count("/") <= 2 and size <= MAX_BYTES for name, size in found.items()), found
    return found


def environment(tree: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "RESULTS", "REQUIRE_GPU_KERNELS")}
    return dict(env, PYTHONPATH=str(tree), PYTHON=sys.executable, **extra)


def test_the_gpu_suite_writes_to_out_alone_and_a_sigterm_leaves_its_summary(tmp_path):
    tree = copy_of_the_checkout(tmp_path / "tree")
    started = tmp_path / "started"
    (tree / "tests" / "gpu" / "test_zz_waits.py").write_text(
        "import os, pathlib, time\n\n\n"
        "def test_waits_for_the_time_limit():\n"
        f"    pathlib.Path({str(started)!r}).touch()\n"
        "    time.sleep(600)\n")
    before = listing(tree)
    out = tmp_path / "results" / "plain"
    # In a session of its own: SIGTERM to the whole process group, as `timeout` sends it.
    run = subprocess.Popen(["bash", "tests/gpu/run.sh"], cwd=tree, env=environment(tree, OUT=str(out)),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert started.exists(), run.communicate(timeout=60)[0].decode()[-3000:]
        os.killpg(run.pid, signal.SIGTERM)
        output = run.communicate(timeout=120)[0].decode()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 124, output[-3000:]
    assert set(results_of(out)) == {"summary.txt", "environment.txt", "gpu-tests.log", "gpu-tests.xml"}
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("REQUIRE_GPU_KERNELS= started ")
    from importlib.metadata import version
    assert summary[0].endswith(f" | versions: torch {version('torch')} | megatron-core {version('megatron-core')} | "
                               f"transformer-engine absent | nvidia-resiliency-ext absent"), summary[0]
    # A line per test as it finished, in ORDER's order (TE's layer spec first), then the one the limit stopped.
    assert summary[1].startswith("SKIPPED ") and "tests/gpu/test_te_spec.py::" in summary[1], summary
    assert sum(line.startswith("SKIPPED ") for line in summary) >= 20
    assert summary[-2].startswith("STOPPED by SIGTERM (the time limit) after ") and summary[-2].endswith(
        " s in tests/gpu/test_zz_waits.py::test_waits_for_the_time_limit"), summary
    assert summary[-1].startswith("exit status 124 after ") and summary[-1].endswith(" (stopped by SIGTERM)")
    assert "needs te: a GPU and Transformer Engine" in (out / "gpu-tests.xml").read_text()  # pytest's report
    assert listing(tree) == before  # nothing written in the tree (no results/, caches or bytecode)


def test_the_quick_benchmark_writes_to_out_alone_and_logs_each_figure(tmp_path):
    tree = copy_of_the_checkout(tmp_path / "tree")
    before = listing(tree)
    out, older = tmp_path / "results", tmp_path / "older_name"
    # OUT wins over RESULTS, its older name; --cpu-smoke: the CPU mode's tiny shapes, the script's own steps.
    run = subprocess.run(["bash", "examples/benchmark_gpu.sh"], cwd=tree, capture_output=True, text=True,
                         env=environment(tree, OUT=str(out), RESULTS=str(older), QUICK="1",
                                         EXTRA_ARGS="--cpu-smoke"), timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert set(results_of(out)) == {"quick.json", "quick.png", "quick.md", "quick.log"} and not older.exists()
    log = (out / "quick.log").read_text()
    assert log.index("nvidia-smi") < log.index("measured: inference | neobert-hf | 64 |")  # the GPU line first
    # --cpu-smoke's micro-batches (2 of 2 sequences) over --quick's 32k tokens each
    assert "measured: training | megatron-packed | 64 | 2x2 | " in log
    assert "| training | megatron-packed | 64 | 2x2 | " in run.stdout  # the Markdown table, printed at the end
    assert listing(tree) == before
