"""The launch scripts' own logic: examples/cuda_env.sh, which they source with the trainer's arguments (one CUDA
hardware queue, CUDA_DEVICE_MAX_CONNECTIONS=1, exactly when tensor parallelism is on, as megatron-core's TP overlap
needs), and how they restart a job that failed or ran out of time."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def connections_after(*args):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    out = subprocess.run(["bash", "-c", 'source "$0" "$@"; echo "${CUDA_DEVICE_MAX_CONNECTIONS-unset}"',
                          str(EXAMPLES / "cuda_env.sh"), *args], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("args, expected", [
    ((), "unset"),
    (("--tensor-model-parallel-size", "1", "--bf16"), "unset"),
    (("--bf16", "--tensor-model-parallel-size", "2"), "1"),
    (("--tensor-model-parallel-size=8",), "1"),
    (("--tensor_model_parallel_size", "4"), "1"),  # the underscore spelling the trainer also reads
    (("--pipeline-model-parallel-size", "2"), "unset"),
])
def test_one_hardware_queue_exactly_with_tensor_parallelism(args, expected):
    assert connections_after(*args) == expected


@pytest.mark.parametrize("script", ["pretrain_neobert.sh", "pretrain_neobert_stage2.sh", "quickstart.sh"])
def test_launch_scripts_source_it_with_the_trainer_arguments_before_starting_ranks(script):
    text = (EXAMPLES / script).read_text()
    source = text.index('source "$(dirname "${BASH_SOURCE[0]}")/cuda_env.sh" "$@"')
    assert source < text.index("torchrun ")


# --------------------------------------------------------------------------------------------------
# The restart logic of pretrain_neobert.sh (torchrun) and pretrain_neobert.slurm (SLURM requeues), run with the
# scheduler's variables set and its commands (srun, scancel, scontrol) and torchrun replaced by scripts that
# write down how they were called: the launch scripts' own logic is what runs.
# --------------------------------------------------------------------------------------------------

STUBS = {
    "torchrun": 'echo "torchrun $*" >>"$CALLS"\n',
    "scontrol": 'if [ "$1 $2" = "show hostnames" ]; then echo node1; echo node2; else echo "scontrol $*" >>"$CALLS"; fi\n',
    # The tasks: they save and exit 0 on SIGTERM, as the trainer with --exit-signal-handler does.
    "srun": ('echo "srun $*" >>"$CALLS"\n'
             'sleep "${SRUN_SECONDS:-0}" & tasks=$!\n'
             'trap \'kill $tasks; echo "srun: saved and stopped" >>"$CALLS"; exit 0\' TERM\n'
             'echo $$ >"$CALLS.srun_pid"; wait $tasks\n'),
    "scancel": ('echo "scancel $*" >>"$CALLS"\n'
                'if [ "$1" = --signal=TERM ]; then kill -TERM "$(cat "$CALLS.srun_pid")"; fi\n'),
}


@pytest.fixture
def scheduler(tmp_path):
    """(environment with the stubs first on PATH, file of their calls)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "RDZV_", "NNODES"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", CALLS=str(calls), CHECKPOINT_DIR=str(tmp_path / "ckpt"),
               DATA_PATH="data/x", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="node[1-2]")
    return env, calls


def run_slurm_script(env, **extra):
    return subprocess.Popen(["bash", str(EXAMPLES / "pretrain_neobert.slurm")], cwd=EXAMPLES.parent,
                            env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_torchrun_restarts_and_rendezvous_of_the_stage_1_script(scheduler):
    env, calls = scheduler
    env = {k: v for k, v in env.items() if k != "SLURM_JOB_ID"}
    subprocess.run(["bash", str(EXAMPLES / "pretrain_neobert.sh")], env=env, check=True)
    command = calls.read_text()
    assert "--rdzv-backend c10d --rdzv-endpoint localhost:6000 --rdzv-id neobert-" in command
    assert "--max-restarts 3 " in command and "--nnodes 1 " in command
    # A lost node's cost bounded by default (docs/training.md, "A host cut off").
    assert "--rdzv-conf join_timeout=60,last_call_timeout=15,read_timeout=60,keep_alive_interval=5," \
           "keep_alive_max_attempt=3 " in command
    # Several nodes must agree on the job's name: refused without one, taken from SLURM's job id within a job.
    refused = subprocess.run(["bash", str(EXAMPLES / "pretrain_neobert.sh")], env={**env, "NNODES": "2:4"},
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "set RDZV_ID to one name for this job on every node" in refused.stderr
    subprocess.run(["bash", str(EXAMPLES / "pretrain_neobert.sh")], check=True,
                   env={**env, "NNODES": "2:4", "SLURM_JOB_ID": "77", "MAX_RESTARTS": "5"})
    assert "--nnodes 2:4 --rdzv-backend c10d --rdzv-endpoint localhost:6000 --rdzv-id 77 --max-restarts 5" \
        in calls.read_text().splitlines()[-1]


def test_slurm_script_saves_and_requeues_before_the_time_limit(scheduler):
    env, calls = scheduler
    job = run_slurm_script(env, SRUN_SECONDS="60")
    wait_for(Path(f"{calls}.srun_pid"))
    job.send_signal(signal.SIGUSR1)  # SLURM's --signal=B:USR1@300
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 0, out
    assert calls.read_text().splitlines()[-3:] == ["scancel --signal=TERM 4242", "srun: saved and stopped",
                                                   "scontrol requeue 4242"]
    assert "neobert-slurm: job 4242 start (at most 20 requeues)" in out
    assert "neobert-slurm: requeueing job 4242 (restart 1)" in out
    runs = (Path(env["CHECKPOINT_DIR"]) / "slurm_runs.log").read_text().splitlines()
    assert [line.split()[1:] for line in runs] == [["start", "job=4242", "restart=0"],
                                                   ["stop", "job=4242", "restart=0", "status=0"]]


def test_slurm_script_says_what_a_restart_after_a_node_failure_lost(scheduler):
    env, calls = scheduler
    ckpt = Path(env["CHECKPOINT_DIR"])
    ckpt.mkdir()
    now = int(time.time())
    (ckpt / "slurm_runs.log").write_text(f"{now - 600} start job=4242 restart=0\n")  # killed: no stop line
    marker = ckpt / "latest_checkpointed_iteration.txt"
    marker.write_text("5000")
    os.utime(marker, (now - 900, now - 900))
    out = subprocess.run(["bash", str(EXAMPLES / "pretrain_neobert.slurm")], cwd=EXAMPLES.parent, check=True,
                         env={**env, "SLURM_RESTART_COUNT": "1"}, capture_output=True, text=True).stdout
    assert "neobert-slurm: job 4242 restart 1 of at most 20" in out
    assert re.search(r"the run before started (600|601) s ago and never stopped \(a node failed", out), out
    assert re.search(r"resuming from iteration 5000, saved (900|901) s ago: the time since is lost", out), out
    assert "scontrol requeue" not in calls.read_text()  # it finished: nothing to requeue


def test_slurm_script_stops_requeueing_at_max_requeues(scheduler):
    env, calls = scheduler
    job = run_slurm_script(env, SRUN_SECONDS="60", SLURM_RESTART_COUNT="2", MAX_REQUEUES="2")
    wait_for(Path(f"{calls}.srun_pid"))
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=30)
    assert "neobert-slurm: not requeued: 2 restarts, MAX_REQUEUES=2" in out and "requeue 4242" not in calls.read_text()
    over = subprocess.run(["bash", str(EXAMPLES / "pretrain_neobert.slurm")], cwd=EXAMPLES.parent,
                          env={**env, "SLURM_RESTART_COUNT": "3", "MAX_REQUEUES": "2"}, capture_output=True, text=True)
    assert over.returncode == 1 and "stopping: more than MAX_REQUEUES=2 restarts" in over.stdout
