"""REQUIRE_GPU_KERNELS=te,fp8,flash,dali (a comma-separated subset, "gpu" implied) turns the skip of a test
that needs one of those kernel paths into a failure: a run meant to prove a path fails where it is absent."""

import os
import re

import pytest

KERNELS = ("gpu", "te", "fp8", "flash", "dali")


def required_kernels():
    names = {k.strip() for k in os.environ.get("REQUIRE_GPU_KERNELS", "").split(",") if k.strip()}
    unknown = names - set(KERNELS)
    if unknown:
        raise pytest.UsageError(f"REQUIRE_GPU_KERNELS: unknown {', '.join(sorted(unknown))} "
                                f"(known: {', '.join(KERNELS)})")
    return names | {"gpu"} if names else names


def pytest_configure(config):
    config.required_kernels = required_kernels()


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
