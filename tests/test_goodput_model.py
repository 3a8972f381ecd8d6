"""The goodput model (megatron_neobert/training/resilience/goodput_model.py): the simulation's bookkeeping, the
simulation and the first-order formula checked against each other where failures are many, the costs read from a goodput account,
the command on a JSON account and on a checkpoint, and the table of docs/training.md."""

import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest

from megatron_neobert.cli.goodput_model import main
from megatron_neobert.defaults import LLAMA3_FAILURES_PER_GPU_DAY
from megatron_neobert.training.resilience.goodput_model import (CATEGORIES, RunCosts, best_interval, costs_from_account,
                                                                expected_goodput, interval_iterations, mean_goodput,
                                                                mtbf_s, optimal_interval_s, simulate)

# docs/training.md's H100 costs of NeoBERT.
COSTS = RunCosts(step_s=0.125, save_s=10.0, startup_s=90.0, load_s=20.0, detection_s=60.0, rendezvous_node_s=0.1)
SEEDS = range(5)
# Two attempts on 2 nodes, 20 s of whose start-up were rendezvous: 5 s per node and attempt.
ACCOUNT = {"job_started": 1.7e9, "taken_at": 1.7e9 + 3700, "attempts": 2, "rendezvous_s": 20.0, "nodes": 2,
           "seconds": {"startup": 180.0, "load": 20.0, "productive": 3000.0, "redone": 50.0, "skipped": 0.0,
                       "evaluation": 100.0, "save": 100.0, "async_save_background": 0.0, "failures": 200.0,
                       "other": 50.0},
           "counts": {"productive": 24000, "redone": 400, "skipped": 0, "evaluation": 2, "save": 10, "load": 1}}


def test_without_failures_the_goodput_is_the_work_share_of_the_save_cycles_after_the_start_up():
    costs = RunCosts(step_s=1.0, save_s=10.0, startup_s=400.0, load_s=20.0)
    run = simulate(costs, gpus=1024, days=1, failure_rate_per_gpu_day=0.0, save_interval_iters=90, seed=0)
    # 86,000 s after the start-up are 860 whole cycles of 90 s of steps and a 10 s save; nothing loads.
    assert run.failures == 0
    assert run.seconds == {**dict.fromkeys(CATEGORIES, 0.0), "startup": 400.0, "productive": 860 * 90.0,
                           "save": 860 * 10.0}
    assert run.goodput == pytest.approx((1 - 400 / 86400) * 90 / 100, rel=1e-12)


@pytest.mark.parametrize("gpus, rate, iters", [(16384, LLAMA3_FAILURES_PER_GPU_DAY, 3775),
                                               (1024, LLAMA3_FAILURES_PER_GPU_DAY, 100_000),
                                               (16384, 30 * LLAMA3_FAILURES_PER_GPU_DAY, 500)])
def test_the_categories_sum_to_the_wall_time_and_only_lost_steps_are_redone(gpus, rate, iters):
    # The last case fails every ~6 min, often during a start-up or a load (cut short: "failures").
    run = simulate(COSTS, gpus, days=54, failure_rate_per_gpu_day=rate, save_interval_iters=iters, seed=3)
    assert sorted(run.seconds) == sorted(CATEGORIES)
    assert sum(run.seconds.values()) == pytest.approx(54 * 86400, rel=1e-9)
    assert run.failures > 0 and run.seconds["failures"] >= run.failures * COSTS.detection_s
    assert 0 < run.seconds["redone"] <= run.seconds["failures"] - run.failures * COSTS.detection_s
    assert all(v >= 0 for v in run.seconds.values()), run.seconds


def test_a_restart_costs_the_rendezvous_of_the_jobs_nodes():
    costs = RunCosts(step_s=1.0, save_s=10.0, startup_s=400.0, load_s=20.0, detection_s=60.0, rendezvous_node_s=0.5)
    # 1,024 GPUs are 128 nodes of 8: 64 s of rendezvous; 16,384 GPUs 2,048 nodes: 1,024 s.
    assert costs.restart_s(1024) == 60 + 400 + 64 + 20 and costs.restart_s(16384) == 60 + 400 + 1024 + 20
    without = dataclasses.replace(costs, rendezvous_node_s=0.0)
    mtbf = mtbf_s(16384, LLAMA3_FAILURES_PER_GPU_DAY)
    assert expected_goodput(without, 16384, 100.0, mtbf) - expected_goodput(costs, 16384, 100.0, mtbf) == \
        pytest.approx(100 / 110 * 1024 / mtbf, rel=1e-9)
    # Each attempt of the simulation starts up for as long, the first one too.
    run = simulate(costs, gpus=1024, days=1, failure_rate_per_gpu_day=0.0, save_interval_iters=90, seed=0)
    assert run.seconds["startup"] == 464.0


def test_a_job_that_fails_before_it_has_started_makes_no_progress():
    costs = RunCosts(step_s=1.0, save_s=10.0, startup_s=2000.0, load_s=0.0)  # 2,000 s to start, a failure every ~84
    run = simulate(costs, gpus=16384, days=1, failure_rate_per_gpu_day=1000 * LLAMA3_FAILURES_PER_GPU_DAY,
                   save_interval_iters=100, seed=0)
    assert run.goodput == 0 and run.seconds["startup"] == 0 and run.seconds["failures"] == pytest.approx(86400)


def test_the_simulation_is_deterministic_for_a_seed():
    def run(seed):
        return simulate(COSTS, 16384, 54, LLAMA3_FAILURES_PER_GPU_DAY, 3775, seed)

    assert run(7) == run(7)
    assert run(7).seconds != run(8).seconds


# Tolerance: second-order terms (failures during restarts, the first start-up) and 5 seeds' noise are ~0.15 points;
# charging a failure's lost work twice (lost, then its recomputation) would be ~2 points off at 16,384 GPUs.
@pytest.mark.parametrize("gpus", [1024, 16384])
@pytest.mark.parametrize("times_optimum", [0.5, 1.0, 2.0])
def test_the_simulated_goodput_agrees_with_the_formula_within_half_a_point(gpus, times_optimum):
    mtbf = mtbf_s(gpus, LLAMA3_FAILURES_PER_GPU_DAY)
    iters = round(times_optimum * interval_iterations(COSTS, mtbf))
    simulated, failures = mean_goodput(COSTS, gpus, 54, LLAMA3_FAILURES_PER_GPU_DAY, iters, SEEDS)
    assert failures > 20  # many failures, so that the mean is the formula's expectation
    assert abs(simulated - expected_goodput(COSTS, gpus, iters * COSTS.step_s, mtbf)) < 0.005


@pytest.mark.parametrize("gpus", [1024, 16384])
def test_the_simulated_best_interval_is_youngs(gpus):
    mtbf = mtbf_s(gpus, LLAMA3_FAILURES_PER_GPU_DAY)
    best, goodput, formula = best_interval(COSTS, gpus, 54, LLAMA3_FAILURES_PER_GPU_DAY, SEEDS)
    assert formula == round(optimal_interval_s(COSTS.save_s, mtbf) / COSTS.step_s)
    assert 1 / 1.5 < best / formula < 1.5, (best, formula)
    assert goodput >= mean_goodput(COSTS, gpus, 54, LLAMA3_FAILURES_PER_GPU_DAY, formula, SEEDS)[0]


def test_a_longer_save_moves_the_simulated_best_interval_out():
    def best(save_s):
        costs = RunCosts(step_s=0.125, save_s=save_s, startup_s=90.0, load_s=20.0)
        return best_interval(costs, 16384, 54, LLAMA3_FAILURES_PER_GPU_DAY, SEEDS)[0]

    assert best(40.0) > 1.4 * best(10.0)  # sqrt(4) = 2 by Young's


def test_costs_from_an_account():
    # 3,000 s over 24,000 steps; 100 s over 10 saves; 180 s of start-up over 2 attempts, 20 s of it rendezvous on 2
    # nodes; one load of 20 s.
    assert costs_from_account(ACCOUNT, detection_s=30.0) == RunCosts(step_s=0.125, save_s=10.0, startup_s=80.0,
                                                                    load_s=20.0, detection_s=30.0,
                                                                    rendezvous_node_s=5.0)
    # An account from before the rendezvous was kept: its start-up holds it.
    older = {key: value for key, value in ACCOUNT.items() if key not in ("rendezvous_s", "nodes")}
    assert costs_from_account(older) == RunCosts(step_s=0.125, save_s=10.0, startup_s=90.0, load_s=20.0)
    never_loaded = {**ACCOUNT, "seconds": {**ACCOUNT["seconds"], "load": 0.0},
                    "counts": {**ACCOUNT["counts"], "load": 0}}
    assert costs_from_account(never_loaded).load_s == 0.0


@pytest.mark.parametrize("change, message", [
    (lambda a: a["seconds"].pop("save"), "the account has no number seconds['save'] (found None)"),
    (lambda a: a.pop("counts"), "the account has no number counts['productive'] (found None)"),
    (lambda a: a.update(attempts="2"), "the account has no number 'attempts' (found '2')"),
    (lambda a: a["counts"].update(productive=0), "the account has no productive step: its count is 0"),
    (lambda a: a["counts"].update(save=0), "the account has no blocking save: its count is 0"),
    (lambda a: a.update(rendezvous_s=None), "the account has no number 'rendezvous_s' (found None)"),
    (lambda a: a.update(nodes=0), "the account has no node: its count is 0"),
])
def test_an_unusable_account_is_refused_naming_the_field(change, message):
    account = json.loads(json.dumps(ACCOUNT))
    change(account)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        costs_from_account(account)


def run_command(capsys, *argv):
    try:
        status = main(list(argv))
    except SystemExit as exit:
        status = exit.code
    out = capsys.readouterr()
    return status, out.out, out.err


def test_the_command_on_a_json_account_prints_the_table(tmp_path, capsys):
    path = tmp_path / "account.json"
    path.write_text(json.dumps(ACCOUNT))
    status, out, err = run_command(capsys, "--account", str(path), "--save-s", "20", "--gpus", "1024", "16384",
                                   "--seeds", "2", "--markdown")
    assert status == 0 and err == "", err
    lines = out.splitlines()
    # The account's costs, --save-s over the account's, the asynchronous save a tenth of it.
    assert lines[0].startswith("costs: step 0.125 s, save 20 s (async: 2 s blocking), start-up 80 s, load 20 s, "
                               "detection 60 s, rendezvous 5 s per node of 8 GPUs; 54 days"), lines[0]
    assert lines[1].startswith("| GPUs | MTBF | failures | save interval (formula) | goodput (formula) |"), lines[1]
    assert [line.split(" | ")[0] for line in lines[3:]] == ["| 1,024", "| 16,384"]
    assert "| 3.1 h |" in lines[4], lines[4]  # 86400 / (4.7e-4 x 16384) s


def test_the_rendezvous_of_an_account_or_stated_feeds_the_table(tmp_path, capsys):
    path = tmp_path / "goodput.json"
    path.write_text(json.dumps(ACCOUNT))

    def formula_goodput(*argv):
        status, out, err = run_command(capsys, "--gpus", "16384", "--seeds", "1", "--markdown", *argv)
        assert status == 0, err
        return out.splitlines()[0], out.splitlines()[3].split(" | ")[4]

    # 5 s per node: 2,048 nodes take 10,240 s of the 11,213 s between failures (Young's formula, by hand).
    line, measured = formula_goodput("--account", str(path))
    assert "rendezvous 5 s per node" in line and measured == "5.05%", measured
    line, stated = formula_goodput("--account", str(path), "--rendezvous-node-s", "0")
    assert "rendezvous 0 s per node" in line and stated == "94.43%", stated
    line, _ = formula_goodput("--step-s", "0.125", "--save-s", "10", "--startup-s", "80", "--load-s", "20",
                              "--rendezvous-node-s", "5")
    assert line.startswith("costs: step 0.125 s, save 10 s (async: 1 s blocking), start-up 80 s, load 20 s, "
                           "detection 60 s, rendezvous 5 s per node"), line
    status, _, err = run_command(capsys, "--account", str(path), "--rendezvous-node-s", "-1")
    assert status == 2 and err.startswith("error: --rendezvous-node-s: -1 s is not a non-negative time"), err


def test_the_command_refuses_an_account_without_a_field_in_one_line(tmp_path, capsys):
    account = json.loads(json.dumps(ACCOUNT))
    del account["seconds"]["productive"]
    path = tmp_path / "account.json"
    path.write_text(json.dumps(account))
    status, out, err = run_command(capsys, "--account", str(path))
    assert status == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --account {path}: the account has no number "
                                                         f"seconds['productive']"), err


def test_the_command_needs_an_account_or_every_cost(capsys):
    status, _, err = run_command(capsys, "--step-s", "1", "--save-s", "10")
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: give --account, or all of --step-s, --save-s, --startup-s, --load-s (missing: "
                          "--startup-s, --load-s)"), err
    status, _, err = run_command(capsys, "--step-s", "0", "--save-s", "10", "--startup-s", "1", "--load-s", "1")
    assert status == 2 and err.startswith("error: --step-s: 0 s is not a positive time"), err


def test_the_command_reads_the_account_of_a_checkpoint(tmp_path, capsys):
    from checkpoint_files import args_only_checkpoint, rewrite_common_state
    from megatron_neobert.checkpoint.layout import iteration_dir

    root = args_only_checkpoint(tmp_path / "ckpt")
    folder = iteration_dir(root, 0)
    status, _, err = run_command(capsys, "--account", root)
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: --account {root}: checkpoint {folder} has no goodput account"), err
    rewrite_common_state(folder, lambda common: common.update(train_state={"goodput": ACCOUNT}))
    for given in (root, folder):  # a root or an iteration folder
        status, out, err = run_command(capsys, "--account", given, "--gpus", "1024", "--seeds", "1")
        assert status == 0, err
        assert out.startswith("costs: step 0.125 s, save 10 s (async: 1 s blocking), start-up 80 s, load 20 s"), out


def test_the_table_of_the_docs_is_the_commands(capsys):
    """docs/training.md, Goodput at scale: the table is what the command above it prints."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    section = docs.split("## Goodput at scale\n", 1)[1].split("\n## ", 1)[0]
    command = re.search(r"^python tools/goodput_model.py (--step-s .*)$", section, re.M).group(1)
    status, out, err = run_command(capsys, *shlex.split(command))
    assert status == 0, err
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert len(table) == 5 and "\n".join(table) in section
