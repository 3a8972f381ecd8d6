"""The suite's time budget (tests/time_budget.py) on a planted suite with a budget of a quarter of a second: a test,
a parametrized test and a fixture over twice that fail the run by name (under xdist, as CI runs it); a listed test and
fixture do not, the one over twice its measured time named in a warning; the listed test is handed out first;
--no-time-budget reports without failing."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

PLANTED_CONFTEST = f"""
import sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
import time_budget
from time_budget import pytest_addoption
time_budget.BUDGET_S = 0.25
time_budget.SLOW = {{"test_planted.py::test_listed": time_budget.Slow(0.2, "planted"),
                     "fixture:listed_fixture": time_budget.Slow(0.6, "planted")}}

def pytest_configure(config):
    config.pluginmanager.register(time_budget.TimeBudget(config), "time_budget")
"""

PLANTED_TESTS = """
import time
import pytest

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def slow_fixture():
    time.sleep(0.7)

@pytest.fixture
def listed_fixture():
    time.sleep(0.7)

def test_fast():
    pass

def test_slow():
    time.sleep(0.7)

def test_listed():
    time.sleep(0.7)

def test_with_fixtures(slow_fixture, listed_fixture):
    pass

@pytest.mark.parametrize("seconds", [0.1, 0.7])
def test_parametrized(seconds):
    time.sleep(seconds)
"""


def test_a_phase_over_its_budget_fails_the_run_by_name_unless_listed(tmp_path):
    (tmp_path / "conftest.py").write_text(PLANTED_CONFTEST)
    (tmp_path / "test_planted.py").write_text(PLANTED_TESTS)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_planted.py"]
    # under xdist: the workers time the fixtures, the controller judges
    run = subprocess.run(command + ["-n", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    errors = sorted(line.split(" took ")[0] for line in run.stdout.splitlines() if line.startswith("error: "))
    assert run.returncode == 1, run.stdout[-3000:]
    assert errors == ["error: fixture:slow_fixture", "error: test_planted.py::test_parametrized",
                      "error: test_planted.py::test_slow"], run.stdout[-3000:]
    warnings = [line.split(" took ")[0] for line in run.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: test_planted.py::test_listed"], run.stdout[-3000:]
    assert "0.8 s: the listed tests' and fixtures' measured time in all" in run.stdout
    # the listed test is handed out first, the rest in their order
    collected = subprocess.run(command + ["--collect-only"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=120).stdout.splitlines()
    assert collected[:3] == ["test_planted.py::test_listed", "test_planted.py::test_fast",
                             "test_planted.py::test_slow"], collected
    reported = subprocess.run(command + ["--no-time-budget"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
    assert reported.returncode == 0 and "error: test_planted.py::test_slow took" in reported.stdout


SPREAD_TESTS = """
import os
import time
import pytest

@pytest.mark.parametrize("name", ["a", "b"])
def test_listed(name, tmp_path_factory):
    time.sleep(1.0)
    with open(os.path.join(os.environ["RAN_ON"], name), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.parametrize("case", range(30))
def test_fast(case):
    pass
"""


def test_the_listed_tests_start_first_on_different_workers(tmp_path):
    (tmp_path / "conftest.py").write_text(PLANTED_CONFTEST)
    (tmp_path / "test_planted.py").write_text(SPREAD_TESTS)
    ran_on = tmp_path / "ran_on"
    ran_on.mkdir()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--no-time-budget",
                          "test_planted.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, RAN_ON=str(ran_on)))
    assert run.returncode == 0, run.stdout[-3000:]
    assert {(ran_on / name).read_text() for name in "ab"} == {"gw0", "gw1"}
