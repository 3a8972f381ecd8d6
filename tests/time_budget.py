"""The suite's time budget, checked at the end of every run. A test's call, and each fixture's set-up, has a budget
of BUDGET_S seconds on the 2-core machine; a run fails naming each phase over MARGIN times that, unless SLOW lists it
with the reason it needs more and its measured time. The list is printed with each entry's time in this run and the
list's total, and a listed phase over MARGIN times its measured time is named in a warning: its figure is stale, or
it got slower. A fixture shared by a session is made by whichever test asks first, so its time is its own: SLOW lists
it as `fixture:NAME`. Tests are named from tests/, parametrized cases sharing their test's entry.

MARGIN is the spread of repeated runs: in three whole-suite runs on the 2-core machine, other jobs beside them, the
slowest phase not on the list took 28 s at best and 49 s at worst, so a phase fails only past twice the budget.
`--no-time-budget` reports the overruns without failing (a loaded workstation, a debugger).
"""

import dataclasses
import time
from itertools import zip_longest

import pytest

BUDGET_S = 30.0
MARGIN = 2.0


@dataclasses.dataclass(frozen=True)
class Slow:
    measured_s: float  # the slower of two whole-suite runs (-n 2 or 3) on the 2-core machine, other jobs beside them
    why: str


# What needs more than BUDGET_S, and why: process trees whose ranks each import torch and megatron-core, and waits
# that are the behaviour under test (a host check, a rendezvous, a collective's timeout).
SLOW = {
    ("test_quickstart.py::test_two_short_runs_with_exported_master_port_and_extra_flags_are_whole_and_"
     "bit_identical"):
        Slow(193, "README's quickstart twice: preprocess, 2 ranks, export, pseudo-perplexity, watcher"),
    "test_partition.py::test_a_lost_host_leaves_the_other_to_go_on_alone_within_the_bound":
        Slow(82, "two hosts' torchruns, the host check, a rendezvous without the lost host, a restart"),
    "test_continue_pretraining.py::test_a_released_checkpoint_of_no_preset_shape_continues_and_exports_as_its_source":
        Slow(70, "examples/continue_pretraining.sh twice: conversion, preprocessing, a torchrun, the export"),
    "test_partition.py::test_a_link_cut_ends_both_hosts_jobs_within_the_bound_and_the_resume_is_exact":
        Slow(68, "two hosts' torchruns, the host check, then the rendezvous' join timeout on host-a"),
    "test_watch.py::test_watch_a_run_while_it_trains_then_restart_prune_and_compare":
        Slow(65, "a trainer and the watcher beside it, each checkpoint converted and scored as it lands"),
    ("test_partition.py::test_a_frozen_host_under_a_fixed_size_ends_the_job_within_the_bound_and_thawed_writes_"
     "nothing"):
        Slow(65, "two hosts' torchruns, the host check, a stop past the others' wait (host-b's: the rendezvous' 30 s "
                 "round), the thaw"),
    "data/test_data_preprocess.py::test_the_data_benchmark_runs_its_parts_on_the_same_tokens":
        Slow(86, "tools/benchmark_data.py end to end, each build in a fresh process"),
    "test_partition.py::test_a_link_restored_before_the_check_lets_the_job_go_on":
        Slow(56, "two hosts' torchruns for a whole run"),
    "test_cpu_node.py::test_conversion_both_ways_the_watcher_and_evaluation_run_on_the_cpu":
        Slow(54, "the tools in turn on a CUDA build of torch without a GPU (lane 2)"),
    "test_benchmark_throughput.py::test_cpu_smoke_run_with_compiled_variants_writes_json_png_and_markdown":
        Slow(54, "every row of the throughput benchmark, compiled variants captured by dynamo"),
    ("test_partition.py::test_a_slow_host_is_named_and_drained_and_the_other_goes_on_alone_from_the_"
     "checkpoint"):
        Slow(64, "two hosts' torchruns, 48 steps to name and drain the throttled host, a rendezvous without it"),
    "test_goodput.py::test_the_final_account_sums_to_torchruns_wall_clock":
        Slow(51, "two torchrun jobs (a run, its requeue with an in-job restart) timed from outside"),
    "test_faults.py::test_kill_9_of_a_rank_under_max_restarts_resumes_within_the_job":
        Slow(51, "a torchrun, a rank killed, the restart's rendezvous and start"),
    "test_partition.py::test_slurm_tasks_cut_apart_both_end_within_the_bound_and_the_requeue_resumes_exactly":
        Slow(51, "two hosts' SLURM tasks, the host check, the requeued tasks"),
    "test_faults.py::test_a_lost_node_continues_on_the_rest":
        Slow(50, "two torchrun agents, one killed, the survivor's rendezvous and restart"),
    "test_bounds.py::test_memory_records_and_threads_stay_flat_over_1150_steps":
        Slow(75, "1,150 steps on 2 ranks: the memory's growth over 1,000 steps, past the history's 1,000"),
    "test_convert.py::test_cli_output_to_a_log_is_plain_lines":
        Slow(60, "two conversions through the command line, the second on 2 spawned ranks (TP=2)"),
    "test_faults.py::test_a_frozen_peer_is_reported_by_the_watchdog_then_ends_the_job":
        Slow(39, "waits out the collectives' timeout (--distributed-timeout-minutes 0.4: 24 s)"),
    "test_faults.py::test_kill_9_of_a_rank_leaves_no_process_behind":
        Slow(37, "a torchrun with DataLoader workers, killed, every process of it gone"),
    "test_faults.py::test_kill_9_of_torchrun_ends_its_ranks_and_frees_the_lock":
        Slow(37, "a torchrun killed, its ranks' ends, the lock taken by a second run"),
}


def listed_name(nodeid: str) -> str:
    """A test's name in SLOW: from tests/, its parametrized cases sharing one entry."""
    return nodeid.split("[")[0].removeprefix("tests/")


def pytest_addoption(parser):
    parser.addoption("--no-time-budget", action="store_true",
                     help=f"report, without failing the run, a test or fixture over {MARGIN:g}x the time budget of "
                          f"{BUDGET_S:g} s that tests/time_budget.py's SLOW does not list")


class TimeBudget:
    """Registered by tests/conftest.py. Under xdist the workers time the fixtures' set-ups into the reports'
    user_properties, and the controller, which sees every report, judges them."""

    def __init__(self, config):
        self.enabled = not config.getoption("--no-time-budget")
        # xdist's load scheduling sends each worker a block of consecutive tests (a quarter of its share) at the
        # start, which would give the listed tests, sorted first, to one worker: two, then one at a time instead, so
        # each idle worker takes the next.
        if config.pluginmanager.hasplugin("xdist") and config.getoption("maxschedchunk") is None:
            config.option.maxschedchunk = 1
        self.judge = not hasattr(config, "workerinput")  # an xdist worker only times
        self.overruns = []
        self.stale = []
        self.seen = {}

    def pytest_collection_modifyitems(self, items):
        """The listed tests first, the longest first: xdist hands tests out in their order, so a long test collected
        late (the quickstart, a two-host rehearsal) would start near the end while the other worker idles. Its first
        hand-out gives each worker two consecutive tests, so each listed test is followed by an unlisted one: each
        worker starts on a long test, and every worker sorts the same collection the same way, as xdist requires."""
        listed = sorted((item for item in items if listed_name(item.nodeid) in SLOW),
                        key=lambda item: -SLOW[listed_name(item.nodeid)].measured_s)
        unlisted = [item for item in items if listed_name(item.nodeid) not in SLOW]
        paired = [item for pair in zip_longest(listed, unlisted[:len(listed)]) for item in pair if item is not None]
        items[:] = paired + unlisted[len(listed):]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        started = time.monotonic()
        yield
        item = getattr(request, "_pyfuncitem", None)
        if item is not None:
            item.user_properties.append(("fixture_s", (fixturedef.argname, time.monotonic() - started)))

    def pytest_runtest_logreport(self, report):
        if not self.judge:
            return
        test = listed_name(report.nodeid)
        phases = [(test, report.duration)] if report.when == "call" else []
        if report.when == "setup":
            phases = [(f"fixture:{name}", seconds) for key, (name, seconds) in report.user_properties
                      if key == "fixture_s"]
        for name, seconds in phases:
            self.seen[name] = max(seconds, self.seen.get(name, 0.0))
            if name in SLOW and seconds > MARGIN * SLOW[name].measured_s:
                self.stale.append((name, seconds))
            elif name not in SLOW and seconds > MARGIN * BUDGET_S:
                self.overruns.append((name, seconds))

    def pytest_terminal_summary(self, terminalreporter):
        write = terminalreporter.write_line
        terminalreporter.write_sep("=", f"time budget: {BUDGET_S:g} s a test or fixture (a run fails past "
                                        f"{MARGIN * BUDGET_S:g} s), {len(SLOW)} listed")
        total = sum(entry.measured_s for entry in SLOW.values())
        for name, entry in sorted(SLOW.items(), key=lambda item: -item[1].measured_s):
            if name in self.seen:
                write(f"{entry.measured_s:5g} s measured, {self.seen[name]:5.1f} s here: {name} ({entry.why})")
        elsewhere = len(SLOW.keys() - self.seen.keys())
        write(f"{total:5g} s: the listed tests' and fixtures' measured time in all"
              + (f" ({elsewhere} of them not run here)" if elsewhere else ""))
        for name, seconds in self.stale:
            write(f"warning: {name} took {seconds:.1f} s, over {MARGIN:g}x the {SLOW[name].measured_s:g} s its entry "
                  "in tests/time_budget.py's SLOW says: measure it again")
        for name, seconds in self.overruns:
            write(f"error: {name} took {seconds:.1f} s, over {MARGIN:g}x the budget of {BUDGET_S:g} s: make it "
                  "shorter, or list it in tests/time_budget.py's SLOW with its reason and measured time")
        if self.overruns and not self.enabled:
            write("(--no-time-budget: not failing the run for them)")

    def pytest_sessionfinish(self, session):
        if self.overruns and self.enabled and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
