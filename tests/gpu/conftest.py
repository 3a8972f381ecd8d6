"""The GPU suite's run: the most informative tests first, each test's result written as it finishes, and what was
running when a time limit stopped the run.

REQUIRE_GPU_KERNELS=te,fp8,flash,dali,nvrx (a comma-separated subset, "gpu" implied) turns the skip of a test that needs
one of those kernel paths into a failure: a run meant to prove a path fails where it is absent.

GPU_TESTS_SUMMARY=FILE (tests/gpu/run.sh sets it) appends one line per test to FILE when it finishes: its outcome,
seconds and the reason of a skip or failure; a SIGTERM (`timeout`) adds a line naming the test it stopped, and the
run then ends as after Ctrl-C, writing its reports.
"""

import os
import re
import signal
import time

import pytest

KERNELS = ("gpu", "te", "fp8", "flash", "dali", "nvrx")
SUMMARY_ENV = "GPU_TESTS_SUMMARY"
# What each file proves, most informative first: a run cut short by its time limit keeps the head of this list. TE's
# numerics, then FP8 running and training, then the local spec's packed kernels (their FlexAttention compile is then
# reused by the sync test's FlexAttention case), the sync check and its positive control, the trainer end to end.
ORDER = ("test_te_spec.py", "test_fp8_step.py", "test_attention_kernels.py", "test_sync_free_step.py",
         "test_quickstart_gpu.py", "test_trainer_options_gpu.py", "test_async_save_gpu.py", "test_straggler_gpu.py")


def required_kernels():
    names = {k.strip() for k in os.environ.get("REQUIRE_GPU_KERNELS", "").split(",") if k.strip()}
    unknown = names - set(KERNELS)
    if unknown:
        raise pytest.UsageError(f"REQUIRE_GPU_KERNELS: unknown {', '.join(sorted(unknown))} "
                                f"(known: {', '.join(KERNELS)})")
    return names | {"gpu"} if names else names


def pytest_configure(config):
    config.required_kernels = required_kernels()


def pytest_collection_modifyitems(items):
    """ORDER's files first, in its order; any other after them, as collected."""
    rank = {name: i for i, name in enumerate(ORDER)}
    items.sort(key=lambda item: rank.get(item.path.name, len(ORDER)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if not (report.skipped and isinstance(report.longrepr, tuple)):
        return
    reason = report.longrepr[2].removeprefix("Skipped: ")
    kernel = re.search(r"needs (\w+):", reason)  # gpu_cases.needs writes "needs <kernel>: <what>"
    if kernel and kernel.group(1) in item.config.required_kernels:
        report.outcome = "failed"
        report.longrepr = f"REQUIRE_GPU_KERNELS lists {kernel.group(1)}, but the test skipped: {reason}"


def _summary(line: str) -> None:
    path = os.environ.get(SUMMARY_ENV)
    if path:
        with open(path, "a") as f:  # opened per line: a killed run keeps every line written before
            f.write(line + "\n")


_running = {"test": None, "since": 0.0}


def _stopped(signum, frame):
    test = _running["test"]
    _summary(f"STOPPED by SIGTERM (the time limit) after {time.monotonic() - _running['since']:.0f} s in {test}"
             if test else "STOPPED by SIGTERM (the time limit) between tests")
    raise KeyboardInterrupt  # pytest then stops as on Ctrl-C and still writes its reports


def pytest_sessionstart(session):
    if os.environ.get(SUMMARY_ENV):
        signal.signal(signal.SIGTERM, _stopped)


def pytest_runtest_logstart(nodeid, location):
    _running.update(test=nodeid, since=time.monotonic())


def pytest_runtest_logreport(report):
    """One line per test, once its outcome is known (a failing set-up or the call; the teardown only if it
    fails)."""
    if report.when == "call" or report.outcome != "passed":
        if report.skipped and isinstance(report.longrepr, tuple):
            why = ": " + report.longrepr[2].removeprefix("Skipped: ")
        elif report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            why = ": " + (crash.message if crash else str(report.longrepr)).splitlines()[0][:300]
        else:
            why = ""
        phase = f" ({report.when})" if report.failed and report.when != "call" else ""
        _summary(f"{report.outcome.upper():8} {report.duration:6.1f} s  {report.nodeid}{phase}{why}")


def pytest_runtest_logfinish(nodeid, location):
    _running["test"] = None
