"""Fault injection: what the trainer does when the cluster, the disk or the user gets it wrong.

Faults that need a process tree run the real CLI under torchrun (2 gloo ranks, each in its own
session as torchrun starts them) and signal or kill processes as a scheduler or a crash would;
the others run one rank inside the test process. Every run trains the tiny cut of
tests/pretrain_cases.py. A resumed run is compared loss for loss with an uninterrupted one of the
same --train-iters (the number of samples drawn decides the data order), stopped where needed
with --exit-interval.
"""

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from checkpoint_files import rewrite_common_state
from megatron_neobert.megatron_core_compat import COMMON_STATE_FILE, COMMON_STATE_IN_SHARDS
from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.checkpoint.integrity import MANIFEST
from megatron_neobert.checkpoint.layout import LATEST_MARKER, iteration_dir, read_latest_iteration
from megatron_neobert.errors import TrainingError
from megatron_neobert.checkpoint.lock import LOCK_NAME, SaveLock
from megatron_neobert.processes import process_start_ticks
from pretrain_cases import after_each_step, full_disk_open, run_train, run_train_until_nonfinite, tiny_argv
from shared_runs import run_once

SCHEDULE = ["--lr-decay-iters", "20"]
LONG = "400"  # --train-iters of the runs a signal stops


def argv(data, *extra):
    return tiny_argv(data[0], data[1], *SCHEDULE, *extra)


def losses(history, start=0):
    return [r["loss"] for r in history["train"] if r["iteration"] > start]


def train_here(data, *extra) -> dict:
    """One rank, in this process."""
    return run_train(argv(data, *extra))


@pytest.fixture(scope="module")
def one_rank_run(data, tmp_path_factory):
    """(history, root) of 8 steps on one rank, a checkpoint every 2; run once per session, copied by the tests
    that change it."""
    def run(folder):
        root = str(folder / "ckpt")
        return train_here(data, "--train-iters", "8", "--save", root, "--save-interval", "2"), root
    return run_once(tmp_path_factory, "test_faults-one_rank_run", run)


def copy_root(root: str, dst) -> str:
    shutil.copytree(root, dst)
    return str(dst)


# --------------------------------------------------------------------------------------------------
# Checkpoint integrity
# --------------------------------------------------------------------------------------------------


def largest_shard(folder: str) -> str:
    return max((n for n in os.listdir(folder) if n.endswith(".distcp")),
               key=lambda n: os.path.getsize(os.path.join(folder, n)))


def damage(folder: str, how: str) -> str:
    """Damage one file of an iteration folder as disks and copies do; returns its name."""
    name = COMMON_STATE_FILE if how == "truncate common.pt" else largest_shard(folder)
    path = os.path.join(folder, name)
    if how == "overwrite 4 KB":  # same size: only the checksum can tell
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            f.write(os.urandom(4096))
    elif how == "missing":
        os.remove(path)
    else:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    return name


@pytest.mark.parametrize("how,problem", [("overwrite 4 KB", "is corrupted"), ("truncate shard", "is truncated"),
                                         ("truncate common.pt", "is truncated"), ("missing", "is missing")])
def test_a_damaged_checkpoint_is_named_and_the_previous_one_offered(how, problem, one_rank_run, data, tmp_path):
    if how == "truncate common.pt" and COMMON_STATE_IN_SHARDS:
        pytest.skip("megatron-core 0.19 keeps the common state in the .distcp files ('truncate shard' covers them)")
    reference, root = one_rank_run
    root = copy_root(root, tmp_path / "ckpt")
    name = damage(iteration_dir(root, 8), how)
    with pytest.raises(TrainingError) as err:
        train_here(data, "--train-iters", "10", "--load", root)
    message = str(err.value)
    assert f"checkpoint {iteration_dir(root, 8)}: {name} {problem}" in message
    assert f"the previous complete checkpoint is iteration 6: resume from it with --load {root} --ckpt-step 6" in message
    assert "\n" not in message
    if how == "overwrite 4 KB":  # the offered checkpoint resumes the run exactly
        resumed = train_here(data, "--train-iters", "8", "--load", root, "--ckpt-step", "6")
        assert losses(resumed) == losses(reference, 6)


def test_a_checkpoint_with_interleaved_rotary_rows_is_refused(one_rank_run, data, tmp_path):
    """Earlier versions stored Q/K rows interleaved without saying so: loading them as rotate-half
    rows would train on silently wrong attention."""
    import torch

    from megatron_neobert.checkpoint.state import checkpoint_args

    root = copy_root(one_rank_run[1], tmp_path / "ckpt")
    rewrite_common_state(iteration_dir(root, 8), lambda common: checkpoint_args(common).pop("rotary_interleaved"))
    with pytest.raises(TrainingError, match=rf"^checkpoint {re.escape(iteration_dir(root, 8))}: its args do not "
                                            r"record rotary_interleaved=False: its Q/K rows are in the interleaved"):
        train_here(data, "--train-iters", "10", "--load", root, "--no-verify-checkpoint")


@pytest.mark.integration
def test_the_damaged_checkpoint_error_is_one_line_and_exit_status_1(one_rank_run, data, tmp_path):
    root = copy_root(one_rank_run[1], tmp_path / "ckpt")
    damage(iteration_dir(root, 8), "truncate shard")
    damage(iteration_dir(root, 6), "overwrite 4 KB")  # the older one is damaged too: iteration 4 is offered
    cli = subprocess.run([sys.executable, "-m", "megatron_neobert.pretrain", *argv(data, "--train-iters", "10",
                                                                                   "--load", root)],
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in cli.stderr.splitlines() if line.startswith("error:")]
    assert cli.returncode == 1 and "Traceback" not in cli.stderr, cli.stderr[-3000:]
    assert len(errors) == 1 and "--ckpt-step 4" in errors[0], cli.stderr[-3000:]


def test_disk_full_during_a_save_leaves_the_last_checkpoint(one_rank_run, data, tmp_path, monkeypatch):
    """First less free space than the last checkpoint took (refused before writing); then
    megatron-core's writer processes (forked: they inherit the patch) run out of space half-way
    through their shard files."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    reference, root = one_rank_run
    root = copy_root(one_rank_run[1], tmp_path / "ckpt")
    shutil.rmtree(iteration_dir(root, 8))
    with open(os.path.join(root, LATEST_MARKER), "w") as f:
        f.write("6")
    usage = shutil.disk_usage(root)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=2**20))
    with pytest.raises(TrainingError, match=rf"^no space left on {re.escape(root)} \(a checkpoint takes \d+\.\d MiB, "
                                            rf"1\.0 MiB are free\): the checkpoint of iteration 8 was not saved"):
        train_here(data, "--train-iters", "8", "--load", root, "--save", root)
    assert not os.path.exists(iteration_dir(root, 8)) and read_latest_iteration(root) == 6
    monkeypatch.undo()

    monkeypatch.setattr(filesystem_async, "open", full_disk_open, raising=False)
    with pytest.raises(TrainingError) as err:
        train_here(data, "--train-iters", "8", "--load", root, "--save", root)
    assert str(err.value).startswith(f"no space left on {root}: the checkpoint of iteration 8 was not saved")
    assert "the latest complete checkpoint is still iteration 6" in str(err.value)
    assert not os.path.exists(iteration_dir(root, 8)) and read_latest_iteration(root) == 6
    monkeypatch.undo()
    resumed = train_here(data, "--train-iters", "8", "--load", root, "--save", root)
    assert losses(resumed) == losses(reference, 6) and read_latest_iteration(root) == 8


# --------------------------------------------------------------------------------------------------
# Non-finite last step, foreign checkpoints, the lock, start-time checks
# --------------------------------------------------------------------------------------------------


def test_a_nonfinite_last_step_still_saves_the_last_finite_state(data, tmp_path):
    root = str(tmp_path / "ckpt")
    stopped, error = run_train_until_nonfinite(argv(data, "--train-iters", "7", "--exit-interval", "5",
                                                    "--save", root), [5])
    assert error is None and stopped[-1]["iteration"] == 5 and stopped[-1]["skipped"]
    assert read_latest_iteration(root) == 5
    uninterrupted, _ = run_train_until_nonfinite(argv(data, "--train-iters", "7"), [5])
    resumed = train_here(data, "--train-iters", "7", "--load", root)
    assert losses(resumed) == [r["loss"] for r in uninterrupted[5:]]


def test_a_nonfinite_stop_after_a_resume_names_the_checkpoint_it_resumed_from(one_rank_run, data):
    _, root = one_rank_run
    _, error = run_train_until_nonfinite(argv(data, "--train-iters", "12", "--load", root,
                                              "--max-skipped-iters", "1"), [1, 2])
    assert error.endswith(f"stopping at iteration 10 without saving. Last good checkpoint: {iteration_dir(root, 8)}")


def test_a_save_folder_with_another_runs_checkpoints_is_refused(one_rank_run, data, tmp_path):
    root = copy_root(one_rank_run[1], tmp_path / "ckpt")
    with pytest.raises(TrainingError, match=rf"--save {re.escape(root)} holds another run's checkpoints "
                                            rf"\(iterations \[2, 4, 6, 8\], latest 8\); resume from them"):
        train_here(data, "--train-iters", "1", "--save", root)
    assert read_latest_iteration(root) == 8
    train_here(data, "--train-iters", "1", "--lr-warmup-iters", "0", "--save", root, "--overwrite-save")
    assert read_latest_iteration(root) == 1 and not os.path.exists(iteration_dir(root, 8))


def write_lock(save: str, **owner) -> None:
    os.makedirs(save, exist_ok=True)
    with open(os.path.join(save, LOCK_NAME), "w") as f:
        json.dump(owner, f)


def test_the_save_lock_refuses_a_live_writer_and_takes_over_a_dead_ones(data, tmp_path):
    import socket

    host, save = socket.gethostname(), str(tmp_path / "ckpt")
    live = subprocess.Popen(["sleep", "60"])
    try:
        write_lock(save, host=host, pid=live.pid, start_ticks=process_start_ticks(live.pid), started="t0")
        with pytest.raises(TrainingError, match=rf"{re.escape(save)} is being written by another run, pid {live.pid}"):
            train_here(data, "--train-iters", "1", "--save", save)
        # The same pid started at another time is another process: the owner is gone.
        write_lock(save, host=host, pid=live.pid, start_ticks="1", started="t0")
        SaveLock(save).release()
    finally:
        live.kill()
        live.wait()
    write_lock(save, host=host, pid=live.pid, start_ticks=process_start_ticks(os.getpid()), started="t0")
    lock = SaveLock(save)  # a dead pid
    assert json.load(open(os.path.join(save, LOCK_NAME)))["pid"] == os.getpid()
    lock.release()
    assert not os.path.exists(os.path.join(save, LOCK_NAME))
    write_lock(save, host="node-17", pid=1234, start_ticks="99", started="t0")
    with pytest.raises(TrainingError, match="held by pid 1234 on host node-17 .* pass --break-save-lock"):
        SaveLock(save)
    SaveLock(save, break_lock=True).release()


def test_the_save_lock_of_an_earlier_attempt_of_the_same_torchrun_run_is_taken_over(tmp_path, monkeypatch, caplog):
    """A lost node held rank 0: its lock names another host, which cannot be asked, but the same torchrun run id
    (torchrun restarts an attempt only once every worker of the one before is stopped)."""
    save = str(tmp_path / "ckpt")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    write_lock(save, host="node-17", pid=1234, start_ticks="99", started="t0", torchrun_run_id="job-7")
    with caplog.at_level(logging.WARNING):
        lock = SaveLock(save)
    assert "taking over the lock of pid 1234 on host node-17 (started t0), an earlier attempt of this torchrun run " \
           "(job-7)" in caplog.text
    assert json.load(open(os.path.join(save, LOCK_NAME)))["torchrun_run_id"] == "job-7"
    lock.release()
    write_lock(save, host="node-17", pid=1234, start_ticks="99", started="t0", torchrun_run_id="job-6")
    with pytest.raises(TrainingError, match="held by pid 1234 on host node-17 .* pass --break-save-lock"):
        SaveLock(save)
    # Static rendezvous without --rdzv-id names every job "none": that names no run.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    write_lock(save, host="node-17", pid=1234, start_ticks="99", started="t0", torchrun_run_id=None)
    with pytest.raises(TrainingError, match="held by pid 1234 on host node-17 .* pass --break-save-lock"):
        SaveLock(save)


# --------------------------------------------------------------------------------------------------
# Nothing wrong resumed silently: checkpoints without checksums, non-finite weights, changed data
# --------------------------------------------------------------------------------------------------


def test_a_trainer_checkpoint_without_its_manifest_is_refused_unless_asked(one_rank_run, data, tmp_path):
    reference, root = one_rank_run
    root = copy_root(root, tmp_path / "ckpt")
    os.remove(os.path.join(iteration_dir(root, 8), MANIFEST))
    with pytest.raises(TrainingError, match=rf"^checkpoint {re.escape(iteration_dir(root, 8))} has no checksums\.json, "
                                            rf"which every save of the trainer writes .*: its files cannot be "
                                            rf"verified; load it anyway with --no-verify-checkpoint$"):
        train_here(data, "--train-iters", "10", "--load", root)
    resumed = train_here(data, "--train-iters", "10", "--load", root, "--no-verify-checkpoint")
    assert [r["iteration"] for r in resumed["train"]] == [9, 10]


def poison(folder: str, key: str = "output_layer.weight") -> None:
    """64 bytes of NaN (0xFF) in the middle of a tensor's bytes in its shard file, as a damaged disk block would
    leave them."""
    from torch.distributed.checkpoint import FileSystemReader

    for index, stored in FileSystemReader(folder).read_metadata().storage_data.items():
        if index.fqn == key:
            with open(os.path.join(folder, stored.relative_path), "r+b") as f:
                f.seek(stored.offset + stored.length // 2)
                f.write(b"\xff" * 64)
            return
    raise AssertionError(f"{key} not in {folder}")


def test_nonfinite_weights_are_never_saved(one_rank_run, data, tmp_path):
    """A damaged checkpoint loaded without its checks: every step is skipped as non-finite, and the final save,
    which would seal the NaN weights as "the last finite state", is refused."""
    root = copy_root(one_rank_run[1], tmp_path / "ckpt")
    poison(iteration_dir(root, 8))
    with pytest.raises(TrainingError, match=rf"^iteration 10: the model's parameters are not finite: not saving "
                                            rf"them; the checkpoint to resume from stays "
                                            rf"{re.escape(iteration_dir(root, 8))}$"):
        train_here(data, "--train-iters", "10", "--load", root, "--save", root, "--no-verify-checkpoint")
    assert read_latest_iteration(root) == 8 and not os.path.exists(iteration_dir(root, 10))


def copy_dataset(prefix: str, folder) -> str:
    folder.mkdir()
    for name in os.listdir(os.path.dirname(prefix)):
        if name.startswith(os.path.basename(prefix)):
            shutil.copy(os.path.join(os.path.dirname(prefix), name), folder / name)
    return str(folder / os.path.basename(prefix))


def rewrite_reversed(prefix: str) -> None:
    """The dataset's documents written again in reverse order: the same sizes, other bytes."""
    import numpy
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    dataset = IndexedDataset(prefix)
    documents = [numpy.array(dataset[i]) for i in range(len(dataset))][::-1]
    dtype = dataset.index.dtype
    del dataset
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for document in documents:
        builder.add_item(torch.from_numpy(document))
        builder.end_document()
    builder.finalize(prefix + ".idx")


def test_a_resume_on_changed_data_is_refused_and_on_touched_data_announced(data, tmp_path, caplog):
    prefix = copy_dataset(data[0], tmp_path / "data")
    here = lambda *extra: run_train(tiny_argv(prefix, str(tmp_path / "cache"), *SCHEDULE, *extra))
    root = str(tmp_path / "ckpt")
    here("--train-iters", "4", "--save", root)
    uninterrupted = here("--train-iters", "6")
    for path in (prefix + ".bin", prefix + ".idx"):  # copied back: the same bytes, other times
        os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    with caplog.at_level(logging.INFO):
        resumed = here("--train-iters", "6", "--load", root)
    assert f"data files modified since {iteration_dir(root, 4)} was saved, with the same sizes and .idx checksum: " \
           f"{prefix}" in caplog.text
    assert losses(resumed) == losses(uninterrupted, 4)
    rewrite_reversed(prefix)
    with pytest.raises(TrainingError, match=rf"^the data changed since {re.escape(iteration_dir(root, 4))} was saved: "
                                            rf"{re.escape(prefix)}\.idx was rewritten \(the same [\d,]+ bytes, "
                                            rf"modified since\) \(other \.idx checksum\); resuming would continue at "
                                            rf"the checkpoint's sample position in other data\. Restore the files, or "
                                            rf"pass --allow-data-change"):
        here("--train-iters", "6", "--load", root)
    assert [r["iteration"] for r in here("--train-iters", "6", "--load", root, "--allow-data-change")["train"]] == [5, 6]


def test_data_changed_under_a_running_job_is_named_and_no_checkpoint_saved(data, tmp_path):
    prefix = copy_dataset(data[0], tmp_path / "data")
    root = str(tmp_path / "ckpt")

    def touch(record):
        if record["iteration"] == 3:
            os.utime(prefix + ".idx", ns=(0, os.stat(prefix + ".idx").st_mtime_ns + 10**9))

    with after_each_step(touch), pytest.raises(TrainingError, match=(
            rf"^the training data changed under the running job: {re.escape(prefix)}\.idx was rewritten \(the same "
            rf"[\d,]+ bytes, modified since\); the checkpoint of iteration 4 was not saved")):
        run_train(tiny_argv(prefix, str(tmp_path / "cache"), *SCHEDULE, "--train-iters", "6", "--save", root,
                            "--save-interval", "2"))
    assert read_latest_iteration(root) == 2


def test_sequence_length_is_checked_and_a_longer_rope_length_is_exported(data, tmp_path):
    from megatron_neobert.conversion.convert import mcore_to_hf

    with pytest.raises(TrainingError, match="--seq-length 64 is longer than the 32 learned positions of the "
                                            "model \\(learned_absolute\\)"):
        train_here(data, "--model-preset", "ablation-m0", "--max-position-embeddings", "32", "--train-iters", "1")
    root, hf = str(tmp_path / "ckpt"), tmp_path / "hf"
    # RoPE with a 32-position preset trained at 64: allowed, and 64 is what the export announces.
    train_here(data, "--max-position-embeddings", "32", "--train-iters", "1", "--lr-warmup-iters", "0", "--save", root)
    mcore_to_hf(root, hf, progress=False)
    read = lambda name: json.loads((hf / name).read_text())
    assert read("config.json")["max_length"] == 64
    assert read("tokenizer_config.json")["model_max_length"] == 64
    assert read("sentence_bert_config.json")["max_seq_length"] == 64


def test_an_optimizer_state_of_another_setup_is_refused_with_the_way_out(one_rank_run, data):
    _, root = one_rank_run
    with pytest.raises(TrainingError, match=r"holds optimizer state of another setup \(--use-distributed-optimizer "
                                            r"off there, on here\); start with a fresh optimizer state with "
                                            r"--no-load-optim"):
        train_here(data, "--train-iters", "9", "--load", root, "--use-distributed-optimizer")
    resumed = train_here(data, "--train-iters", "9", "--load", root, "--use-distributed-optimizer", "--no-load-optim")
    assert [r["iteration"] for r in resumed["train"]] == [9]


def test_an_invalid_hf_config_json_is_named(tmp_path):
    from megatron_neobert.conversion.convert import ConversionError, hf_to_mcore

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "neobert",')
    with pytest.raises(ConversionError, match=rf"{re.escape(str(tmp_path / 'hf' / 'config.json'))} is not valid JSON"):
        hf_to_mcore(tmp_path / "hf", tmp_path / "out", progress=False)


def test_fault_flags_have_megatron_lm_defaults(data):
    settings = parse_settings(argv(data))
    faults = settings.faults
    assert faults.exit_signal == "SIGTERM" and faults.distributed_timeout_minutes == 10
    assert faults.exit_duration_in_mins is None and not settings.checkpoint.no_verify_checkpoint


@pytest.mark.integration
def test_exit_duration_saves_and_stops_all_ranks_at_one_step(data, tmp_path):
    root = str(tmp_path / "ckpt")
    history = run_on_ranks(run_train, 2, argv(data, "--train-iters", "50", "--exit-duration-in-mins", "0.0001",
                                              "--save", root))
    assert [h["exit"] for h in history] == ["exit-duration"] * 2
    assert history[0]["iteration"] == history[1]["iteration"] == read_latest_iteration(root)


# --------------------------------------------------------------------------------------------------
# Process trees under torchrun
# --------------------------------------------------------------------------------------------------


def processes() -> dict:
    """{pid: (parent pid, session id)} of every process."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat").read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            found[int(name)] = (int(fields[1]), int(fields[3]))
    return found


# The product's time bounds below (how soon a job ends after a fault, how soon a restart trains again) hold on an
# idle machine. A busy one (CI runners, shared cores) is slower at everything, so each bound is multiplied by how
# much slower than idle this test's own job was to start and take its first step (at least 1); a hang still fails.
# Seconds from torchrun's start to the first step's log line, and to the error line of a run refused before any
# step, of the 2-rank tiny jobs below on 2 idle cores (the fastest of several runs).
IDLE_S = {"first step": 9.0, "refused before training": 8.0}


class Job:
    """A torchrun agent (by default `torchrun --standalone --nproc-per-node 2 -m megatron_neobert.pretrain ...`) in
    its own session; its output (stdout and stderr) collected line by line, each with the time it came. `prefix`: a
    command that runs torchrun's in its place (exec: the agent keeps its pid), such as another host's namespace.
    `task`: no torchrun; the process is one rank, started as SLURM starts a task, with these variables (RANK,
    WORLD_SIZE, MASTER_ADDR...)."""

    def __init__(self, train_argv, *torchrun_flags, entry=("-m", "megatron_neobert.pretrain"),
                 launcher=("--standalone", "--nproc-per-node", "2"), prefix=(), task=None):
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(task or {}))
        self.nproc = 0 if task else int(launcher[launcher.index("--nproc-per-node") + 1])
        torchrun = () if task else ("-m", "torch.distributed.run", *launcher, *torchrun_flags)
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*prefix, sys.executable, *torchrun, *entry, *train_argv],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, env=env)
        self.lines, self.times, self.sessions = [], [], set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.times.append(time.monotonic())
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 900) -> re.Match:
        """The first match of `pattern` in the output, waiting for it (the generous default is no promise: it only
        ends a test whose job hangs before its fault)."""
        deadline, ended = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            if self.proc.poll() is not None:  # the reader may still hold the last lines
                ended = ended or time.monotonic()
                if time.monotonic() - ended > 2:
                    break
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in the output:\n{self.output[-4000:]}")

    def time_of(self, pattern: str, after: float = 0.0, timeout: float = 900) -> float:
        """When the first line matching `pattern` among those that came after `after` came (time.monotonic()),
        waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            found = [t for t, line in zip(list(self.times), list(self.lines)) if t >= after and re.search(pattern, line)]
            if found:
                return found[0]
            assert time.monotonic() < deadline and self.proc.poll() is None, \
                f"no {pattern!r} in the output:\n{self.output[-4000:]}"
            time.sleep(0.2)

    def slowdown(self, mark: str = r"iteration +1/", idle: str = "first step") -> float:
        """How many times slower than on an idle machine this job reached `mark` (IDLE_S[idle]); at least 1."""
        return max(1.0, (self.time_of(mark) - self.started) / IDLE_S[idle])

    def ranks(self) -> list:
        """The rank processes (torchrun's children), once all are up; each leads its own session."""
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            children = sorted(pid for pid, (ppid, _) in processes().items() if ppid == self.proc.pid)
            if len(children) == self.nproc:
                self.sessions |= set(children)
                return children
            time.sleep(0.2)
        raise AssertionError(f"torchrun did not start {self.nproc} ranks")

    def first_error(self) -> str:
        return next((line.strip() for line in self.lines if line.startswith("error:")), None)

    def errors(self) -> list:
        """Lines that report an error, but torchrun's own report of the signal it got."""
        return [line for line in self.lines if re.search(r"Error|Exception|killed by signal", line)
                and "SignalException" not in line]

    def logged_losses(self, after: float = 0.0) -> dict:
        """{iteration: the logged loss, as printed} of the step lines that came after `after` (time.monotonic())."""
        return {int(m.group(1)): m.group(2) for t, line in zip(list(self.times), list(self.lines)) if t >= after
                for m in [re.search(r"iteration +(\d+)/.*\| lm loss: (\S+) \|", line)] if m}

    def survivors(self) -> list:
        return [pid for pid, (_, sid) in processes().items() if sid in self.sessions]

    def wait_until_gone(self, timeout: float) -> float:
        """Seconds until no process of the ranks' sessions is left."""
        start = time.monotonic()
        while self.survivors():
            assert time.monotonic() - start < timeout, (self.survivors(), self.output[-3000:])
            time.sleep(0.2)
        return time.monotonic() - start

    def close(self):
        for pid in self.survivors() + [self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)


@pytest.fixture
def job_factory():
    jobs = []

    def start(*args, **kwargs):
        jobs.append(Job(*args, **kwargs))
        return jobs[-1]

    yield start
    for job in jobs:
        job.close()


def long_run(data, root, *extra):
    return argv(data, "--train-iters", LONG, "--log-interval", "1", "--save", root, *extra)


def stopped_iteration(job: Job) -> int:
    return int(job.wait_for(r"stopping at iteration (\d+) \(signal\)").group(1))


@pytest.mark.integration
def test_sigterm_to_torchrun_with_data_workers_saves_and_resumes_exactly(data, tmp_path, job_factory):
    """torchrun forwards SIGTERM to each rank's process group, DataLoader workers included."""
    root = str(tmp_path / "ckpt")
    job = job_factory(long_run(data, root, "--exit-signal-handler", "--num-workers", "1"))
    job.ranks()
    job.wait_for(r"iteration +2/")
    slowdown = job.slowdown()
    os.killpg(job.proc.pid, signal.SIGTERM)
    stop = stopped_iteration(job)
    job.wait_for(rf"done: iteration {stop} \(signal\)")
    job.proc.wait(timeout=120 * slowdown)
    job.wait_until_gone(30 * slowdown)
    assert not job.errors(), job.errors()
    assert read_latest_iteration(root) == stop and os.path.isfile(os.path.join(iteration_dir(root, stop), MANIFEST))
    until = ["--train-iters", LONG, "--exit-interval", str(stop + 2)]
    resumed = run_on_ranks(run_train, 2, argv(data, *until, "--load", root))[0]
    uninterrupted = run_on_ranks(run_train, 2, argv(data, *until))[0]
    assert len(losses(resumed)) == 2 and losses(resumed) == losses(uninterrupted, stop)


@pytest.mark.integration
def test_sigusr1_to_one_ranks_process_group_saves_on_all_ranks(data, tmp_path, job_factory):
    """No DataLoader workers: the signal reaches the rank and its checkpoint writers."""
    root = str(tmp_path / "ckpt")
    job = job_factory(long_run(data, root, "--exit-signal-handler", "--exit-signal", "SIGUSR1",
                               "--save-interval", "1"))
    _, rank1 = job.ranks()
    job.wait_for(r"saved checkpoint at iteration 2 ")
    slowdown = job.slowdown()
    os.killpg(rank1, signal.SIGUSR1)
    stop = stopped_iteration(job)
    assert job.proc.wait(timeout=120 * slowdown) == 0, job.output[-3000:]
    assert not job.errors() and read_latest_iteration(root) == stop, job.errors()
    job.wait_until_gone(30 * slowdown)


FORKING_RANK = """
import multiprocessing as mp, os, sys, threading, time
from megatron_neobert.training.resilience.guards.children import ChildrenTie
ChildrenTie().__enter__()
fork = mp.get_context("fork")
main_child = fork.Process(target=time.sleep, args=(600,))  # as megatron-core forks a checkpoint writer
main_child.start()
thread_child = fork.Process(target=time.sleep, args=(600,))
worker = threading.Thread(target=thread_child.start)  # forked by a thread that ends at once
worker.start(); worker.join()
print(main_child.pid, thread_child.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for its parent to collect it."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.integration
def test_children_the_main_thread_forks_die_with_the_rank_killed_by_sigkill():
    rank = subprocess.Popen([sys.executable, "-c", FORKING_RANK], stdout=subprocess.PIPE, text=True)
    try:
        main_child, thread_child = map(int, rank.stdout.readline().split())
        time.sleep(0.5)
        assert alive(main_child) and alive(thread_child)  # the ended thread did not take its child along
        rank.kill()
        rank.wait()
        deadline = time.monotonic() + 10
        while alive(main_child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(main_child)
        assert alive(thread_child)  # a child of another thread is not tied to the rank's lifetime
    finally:
        for pid in (main_child, thread_child):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
def test_kill_9_of_torchrun_ends_its_ranks_and_frees_the_lock(data, tmp_path, job_factory):
    root = str(tmp_path / "ckpt")
    job = job_factory(long_run(data, root, "--num-workers", "1", "--save-interval", "1"))
    job.ranks()
    job.wait_for(r"iteration +2/")
    slowdown = job.slowdown()
    os.kill(job.proc.pid, signal.SIGKILL)
    print(f"ranks gone {job.wait_until_gone(30 * slowdown):.1f} s after torchrun (slowdown {slowdown:.1f})")
    job.wait_for(r"torchrun \(pid \d+\) is gone; exiting without saving")
    lock = SaveLock(root)  # the dead run's lock is taken over
    lock.release()
    latest = read_latest_iteration(root)
    assert latest >= 1 and os.path.isfile(os.path.join(iteration_dir(root, latest), MANIFEST))


@pytest.mark.integration
def test_kill_9_of_a_rank_leaves_no_process_behind(data, tmp_path, job_factory):
    root = str(tmp_path / "ckpt")
    job = job_factory(long_run(data, root, "--num-workers", "1", "--save-interval", "1"))
    rank0, _ = job.ranks()
    job.wait_for(r"saved checkpoint at iteration 2 ")
    slowdown = job.slowdown()
    os.kill(rank0, signal.SIGKILL)
    assert job.proc.wait(timeout=120 * slowdown) != 0
    print(f"all gone {job.wait_until_gone(60 * slowdown):.1f} s after torchrun (slowdown {slowdown:.1f})")
    latest = read_latest_iteration(root)
    assert latest >= 2 and os.path.isfile(os.path.join(iteration_dir(root, latest), MANIFEST))


@pytest.mark.integration
def test_a_torchrun_killed_while_its_ranks_start_leaves_none_behind(data, tmp_path, job_factory):
    """Before the process group exists the ranks would wait for the dead torchrun's store until its timeout."""
    job = job_factory(long_run(data, str(tmp_path / "ckpt")))
    job.ranks()
    time.sleep(2)  # importing, or in the rendezvous: no step yet
    os.kill(job.proc.pid, signal.SIGKILL)
    print(f"ranks gone {job.wait_until_gone(60):.1f} s after torchrun")
    assert not re.search(r"iteration +\d+/", job.output)


# --------------------------------------------------------------------------------------------------
# In-job restarts: torchrun --max-restarts, and a lost node under --nnodes MIN:MAX
# --------------------------------------------------------------------------------------------------

RESTARTED = r"restarted after failure: resumed at iteration (\d+), (\d+) steps redone, ([\d.]+) s lost"


def checkpoint_tensors(folder: str, tmp_path) -> dict:
    """Every tensor of an iteration folder (weights, Adam moments), read without a process group."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{os.path.basename(folder)}-{abs(hash(folder))}.pt"
    dcp_to_torch_save(folder, out)
    return {k: v for k, v in torch.load(out, weights_only=False).items() if isinstance(v, torch.Tensor)}


def assert_same_tensors(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    different = [k for k in a if not bool((a[k] == b[k]).all())]
    assert not different, different


def logged(history: dict, start: int) -> dict:
    """{iteration: loss as the log prints it} of the steps after `start`."""
    return {r["iteration"]: f"{r['loss']:.6E}" for r in history["train"] if r["iteration"] > start}


def restart_cost(job: Job, fault: float) -> tuple:
    """(iteration resumed at, steps redone, seconds lost as the trainer says, seconds from the fault to the first
    step after the restart as the log's times say)."""
    found = job.wait_for(RESTARTED)
    resumed = int(found.group(1))
    first_step = job.time_of(rf"iteration +{resumed + 1}/", after=job.time_of(RESTARTED))
    return resumed, int(found.group(2)), float(found.group(3)), first_step - fault


@pytest.mark.integration
def test_kill_9_of_a_rank_under_max_restarts_resumes_within_the_job(data, tmp_path, job_factory):
    """torchrun restarts both ranks on the store of the failed attempt: the process groups of the new attempt live
    under a name of their own, rank 0 takes over the lock of the dead one, and the run ends as if uninterrupted."""
    root, reference_root = str(tmp_path / "ckpt"), str(tmp_path / "reference")
    train = argv(data, "--train-iters", "16", "--log-interval", "1", "--save-interval", "5")
    job = job_factory([*train, "--save", root, "--load", root], "--max-restarts", "2")
    rank0, _ = job.ranks()
    job.wait_for(r"iteration +7/")  # past the checkpoint of iteration 5
    slowdown = job.slowdown()
    os.kill(rank0, signal.SIGKILL)
    fault = time.monotonic()
    resumed, redone, lost, to_first_step = restart_cost(job, fault)
    restarted = job.time_of(RESTARTED)
    assert job.proc.wait(timeout=600) == 0, job.output[-3000:]
    print(f"kill -9 of rank 0 after iteration 7: resumed at iteration {resumed}, {redone} steps redone, "
          f"{lost:.1f} s lost (trainer), first step {to_first_step:.1f} s after the kill (slowdown {slowdown:.1f})")
    # A restart costs what a start costs, and the time torchrun takes to notice: 3 starts at most.
    assert resumed in (5, 10) and to_first_step < 3 * IDLE_S["first step"] * slowdown
    assert "taking over the lock of pid" in job.output
    # The end-of-run table: the 16 steps once each as productive, the redone ones again, both attempts' time.
    table = {row[:50].strip(): row[50:].split() for row in job.output[job.output.index("where the job's time went"):]
             .splitlines()[2:13]}
    assert table["productive steps"][2] == "16" and table["steps redone after a restart"][2] == str(redone)
    assert float(table["between attempts (detection, restart)"][0]) > 0
    assert table["total (wall time since the job's first start)"][2] == "2"
    reference = run_on_ranks(run_train, 2, [*train, "--save", reference_root])[0]
    assert job.logged_losses(after=restarted) == logged(reference, resumed)
    assert_same_tensors(checkpoint_tensors(iteration_dir(root, 16), tmp_path),
                        checkpoint_tensors(iteration_dir(reference_root, 16), tmp_path))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 600) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on port {port}"
            time.sleep(0.2)


@pytest.mark.integration
def test_a_lost_node_continues_on_the_rest(data, tmp_path, job_factory):
    """Two torchrun agents of one rank each on one machine stand for two nodes (--nnodes 1:2, c10d rendezvous);
    kill -9 of the second agent (its rank dies with it) leaves the first to go on alone from the last checkpoint:
    the same global batch at twice the accumulation, the losses of a run that was at 1 rank from that checkpoint."""
    root, reference_root = str(tmp_path / "ckpt"), str(tmp_path / "reference")
    train = argv(data, "--train-iters", "16", "--log-interval", "1", "--save-interval", "5")
    port = free_port()
    launcher = ("--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"127.0.0.1:{port}", "--rdzv-id", f"lost-node-{port}",
                # the survivor waits for the other node at most 10 s; a node missing 3 heartbeats of 1 s is gone
                "--rdzv-conf", "last_call_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3")
    survivor = job_factory([*train, "--save", root, "--load", root], "--max-restarts", "2", launcher=launcher)
    wait_for_port(port)  # the first agent holds the rendezvous (and, started first, is node 0): it must stay
    lost = job_factory([*train, "--save", root, "--load", root], "--max-restarts", "2", launcher=launcher)
    survivor.wait_for(r"layout: 2 ranks")
    # Past the checkpoint of iteration 5, and well before the one of 15: the lost rank ends as its agent does, the
    # survivor steps on until its next collective meets the broken connection (a step or two here).
    survivor.wait_for(r"iteration +6/")
    slowdown = survivor.slowdown()
    os.kill(lost.proc.pid, signal.SIGKILL)
    fault = time.monotonic()
    resumed, redone, lost_s, to_first_step = restart_cost(survivor, fault)
    restarted = survivor.time_of(RESTARTED)
    assert survivor.proc.wait(timeout=600) == 0, survivor.output[-3000:]
    lost.wait_until_gone(30 * slowdown)
    print(f"kill -9 of the second agent after iteration 6: resumed at iteration {resumed} on 1 rank, "
          f"{redone} steps redone, {lost_s:.1f} s lost (trainer), first step {to_first_step:.1f} s after the kill "
          f"(slowdown {slowdown:.1f})")
    # The other node's heartbeats stop, the rendezvous waits for it 10 s: then a start on the survivor.
    assert resumed in (5, 10) and to_first_step < 3 + 10 + 3 * IDLE_S["first step"] * slowdown
    assert "world size 2 -> 1: gradient accumulation 2 -> 4" in survivor.output
    assert re.search(r"layout: 1 ranks = .* global batch 8 = micro-batch 2 x 4 accumulation x DP 1", survivor.output)
    reference = run_on_ranks(run_train, 1, [*train, "--load", root, "--ckpt-step", str(resumed),
                                            "--save", reference_root])[0]
    assert survivor.logged_losses(after=restarted) == logged(reference, resumed)
    assert_same_tensors(checkpoint_tensors(iteration_dir(root, 16), tmp_path),
                        checkpoint_tensors(iteration_dir(reference_root, 16), tmp_path))


# --------------------------------------------------------------------------------------------------
# A failure on any rank ends the whole job, DataLoader workers included
# --------------------------------------------------------------------------------------------------

WORKERS = "2"  # --num-workers' default (tiny_argv runs without workers)
# For the faults that cost seconds: without DataLoader workers, and with the default's (one worker or two take the
# same path: the fault in a worker process, reported by the rank).
WITH_AND_WITHOUT_WORKERS = pytest.mark.parametrize("workers", ["0", WORKERS])


def ends_after_error(job: Job, error: str, within: float = 30, mark: str = r"iteration +1/",
                     idle: str = "first step") -> float:
    """Seconds from the first `error:` line, which must match `error`, until torchrun has failed and no
    process of the ranks (DataLoader workers, checkpoint writers) is left; at most `within` times the job's slowdown
    (to `mark`, see IDLE_S)."""
    job.ranks()
    start = job.time_of(r"^error: ")
    assert re.search(error, job.first_error()), job.output[-3000:]
    within *= job.slowdown(mark, idle)
    try:
        assert job.proc.wait(timeout=max(1.0, within - (time.monotonic() - start))) != 0
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the job still runs {within:.0f} s after its error line:\n{job.output[-4000:]}")
    job.wait_until_gone(within - (time.monotonic() - start))
    return time.monotonic() - start


@pytest.mark.integration
def test_a_frozen_peer_is_reported_by_the_watchdog_then_ends_the_job(data, tmp_path, job_factory):
    """The rank left waiting fails at the timeout, its workers with it, and kills the stopped rank beside it:
    torchrun would SIGTERM it, which a stopped process does not act on, and SIGKILL it only 30 s later."""
    root, timeout_s = str(tmp_path / "ckpt"), 0.4 * 60
    job = job_factory(long_run(data, root, "--distributed-timeout-minutes", "0.4", "--save-interval", "2",
                               "--num-workers", WORKERS))
    rank0, rank1 = job.ranks()
    job.wait_for(r"iteration +3/")
    slowdown = job.slowdown()  # the collectives' timeout is wall-clock time: only the margins after it scale
    os.kill(rank1, signal.SIGSTOP)
    start = time.monotonic()
    found = job.wait_for(r"watchdog: rank 0 has made no progress for \d+ s in iteration (\d+) \(([a-z ]+)\)",
                         timeout_s + 60 * slowdown)
    job.wait_for(r"(?m)^error: ", timeout_s + 60 * slowdown)
    # gloo says "Timed out ..." or "Application timeout caused pair closure", as the wait ends.
    assert re.search(r"^error: rank 0: .*([Tt]imed out|timeout)", job.first_error()), job.output[-3000:]
    while any(sid == rank0 for _, sid in processes().values()):  # rank 0 and its workers
        assert time.monotonic() - start < timeout_s + 10 * slowdown, job.output[-3000:]
        time.sleep(0.1)
    rank0_ended = time.monotonic() - start
    assert job.proc.wait(timeout=15 * slowdown) != 0
    job.wait_until_gone(5 * slowdown)
    ended = time.monotonic() - start
    print(f"watchdog line: {found.group(0)!r}; after the freeze rank 0 ended in {rank0_ended:.1f} s, the job in "
          f"{ended:.1f} s (slowdown {slowdown:.1f})")
    assert int(found.group(1)) >= 3 and ended < timeout_s + 15 * slowdown
    assert read_latest_iteration(root) >= 2


@pytest.mark.integration
@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_data_file_truncated_under_the_job_is_named(workers, data, tmp_path, job_factory):
    """The .idx is memory-mapped: its truncation kills the reader with SIGBUS, in the rank or its DataLoader worker
    (whose handler torch would have blame shared memory). The line names the file instead."""
    prefix = copy_dataset(data[0], tmp_path / "data")
    job = job_factory(tiny_argv(prefix, str(tmp_path / "cache"), *SCHEDULE, "--train-iters", LONG, "--log-interval",
                                "1", "--num-workers", workers))
    job.ranks()
    job.wait_for(r"iteration +3/")
    size = os.path.getsize(prefix + ".idx")
    os.truncate(prefix + ".idx", 0)
    took = ends_after_error(job, rf"^error: rank \d: bus error reading a memory-mapped data file: "
                                 rf"{re.escape(prefix)}\.idx was rewritten \({size:,} -> 0 bytes\)$")
    print(f"job ended {took:.1f} s after the error line")
    assert "shared memory" not in job.output


SLOW_WRITER_RANK = """import os, sys, time
sys.path.insert(0, {tests!r})
from megatron_neobert import megatron_core_compat
from megatron_neobert.megatron_core_compat import _filesystem_async_modules


def slow_open(path, *args, **kwargs):  # a shard write that takes seconds, announced in {announce!r}
    stream = open(path, *args, **kwargs)
    if str(path).endswith(".distcp"):
        folder = os.path.basename(os.path.dirname(path))
        open(os.path.join({announce!r}, f"{{folder}}-{{os.getpid()}}"), "w").close()
        time.sleep(4)
    return stream


for module in _filesystem_async_modules():
    module.open = slow_open
from megatron_neobert.pretrain import cli
cli()
"""


@pytest.mark.integration
def test_kill_9_during_an_asynchronous_save_leaves_the_previous_checkpoint(data, tmp_path, job_factory):
    """--async-save: a rank killed while the forked writers write leaves the marker on the last complete,
    sealed checkpoint, no writer behind, and a job that resumes from it."""
    root, announce, rank = str(tmp_path / "ckpt"), tmp_path / "writing", tmp_path / "slow_writer_rank.py"
    announce.mkdir()
    rank.write_text(SLOW_WRITER_RANK.format(tests=os.path.dirname(os.path.abspath(__file__)), announce=str(announce)))
    job = job_factory(long_run(data, root, "--async-save", "--save-interval", "2", "--num-workers", "0"),
                      entry=(str(rank),))
    rank0, _ = job.ranks()
    job.wait_for(r"asynchronous saves through .* \(async_strategy='(mcore|nvrx)'")
    deadline = time.monotonic() + 600
    while not (read_latest_iteration(root) and any(name.startswith(os.path.basename(
            iteration_dir(root, read_latest_iteration(root) + 2))) for name in os.listdir(announce))):
        assert time.monotonic() < deadline and job.proc.poll() is None, job.output[-3000:]
        time.sleep(0.1)
    latest = read_latest_iteration(root)  # complete; the next one is being written
    os.kill(rank0, signal.SIGKILL)
    assert job.proc.wait(timeout=300) != 0
    job.wait_until_gone(120)  # the writers forked by the ranks went with them
    assert read_latest_iteration(root) == latest
    assert os.path.isfile(os.path.join(iteration_dir(root, latest), MANIFEST))
    assert not os.path.isfile(os.path.join(iteration_dir(root, latest + 2), MANIFEST))
    resumed = train_here(data, "--train-iters", str(latest + 2), "--load", root, "--save", str(tmp_path / "resumed"))
    assert [r["iteration"] for r in resumed["train"]] == [latest + 1, latest + 2]


FULL_DISK_RANK = """import sys
sys.path.insert(0, {tests!r})
from megatron.core.dist_checkpointing.strategies import filesystem_async
from pretrain_cases import full_disk_open
filesystem_async.open = full_disk_open
from megatron_neobert.pretrain import cli
cli()
"""


@pytest.mark.integration
@WITH_AND_WITHOUT_WORKERS
def test_a_full_disk_is_named_and_ends_the_job(workers, data, tmp_path, job_factory):
    root, rank = str(tmp_path / "ckpt"), tmp_path / "full_disk_rank.py"
    rank.write_text(FULL_DISK_RANK.format(tests=os.path.dirname(os.path.abspath(__file__))))
    job = job_factory(argv(data, "--train-iters", "4", "--save", root, "--save-interval", "2", "--log-interval", "1",
                           "--num-workers", workers), entry=(str(rank),))
    took = ends_after_error(job, rf"^error: no space left on {re.escape(root)}: the checkpoint of iteration 2 "
                                 rf"was not saved")
    print(f"job ended {took:.1f} s after the error line")
    assert read_latest_iteration(root) is None and not os.path.exists(iteration_dir(root, 2))


@pytest.fixture(scope="module")
def beyond_the_vocabulary(tmp_path_factory):
    """400 documents of ids up to 9,000, beyond the sample tokenizer's 8,192: {"record": prefix} with a
    tokenizer record naming the largest id, {"no record": prefix} as another tool writes them."""
    import numpy
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, get_bin_path, get_idx_path

    from megatron_neobert.atomic_write import write_json_atomic
    from megatron_neobert.data.assets import SAMPLE_TOKENIZER
    from megatron_neobert.data.records import record_path, tokenizer_record
    from megatron_neobert.data.tokenizer import build_tokenizer

    root, rng = tmp_path_factory.mktemp("beyond_the_vocabulary"), numpy.random.default_rng(0)
    documents = [rng.integers(5, 9001, rng.integers(16, 128)) for _ in range(400)]
    documents[0][-1] = 9000
    prefixes = {kind: str(root / kind.replace(" ", "_")) for kind in ("record", "no record")}
    for prefix in prefixes.values():
        builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=numpy.uint16)
        for document in documents:
            builder.add_item(torch.from_numpy(document))
            builder.end_document()
        builder.finalize(get_idx_path(prefix))
    record = tokenizer_record(build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER), append_eod=False)
    write_json_atomic(record_path(prefixes["record"]), {**record, "max_token_id": 9000})
    return prefixes


@pytest.mark.integration
def test_ids_beyond_the_vocabulary_with_a_record_end_the_job_before_training(beyond_the_vocabulary, tmp_path,
                                                                             job_factory):
    prefix = beyond_the_vocabulary["record"]
    job = job_factory(tiny_argv(prefix, str(tmp_path / "cache"), *SCHEDULE, "--train-iters", "4",
                                "--split", "99,1,0", "--num-workers", WORKERS))
    # Refused by every rank before the process group exists, rank 0 saying it: one line, no rank's traceback.
    took = ends_after_error(job, rf"^error: dataset {re.escape(prefix)} was tokenized with "
                                 rf".* largest id 9,000\) but training uses .* with 8,192 entries",
                            mark=r"^error: ", idle="refused before training")
    print(f"job ended {took:.1f} s after the error line")
    assert not re.search(r"iteration +\d+/", job.output)


@pytest.mark.integration
@WITH_AND_WITHOUT_WORKERS
def test_ids_beyond_the_vocabulary_without_a_record_end_the_job_as_read(workers, beyond_the_vocabulary, tmp_path,
                                                                        job_factory):
    """The error is raised where the sample is read: in a DataLoader worker when there are any."""
    prefix = beyond_the_vocabulary["no record"]
    job = job_factory(tiny_argv(prefix, str(tmp_path / "cache"), *SCHEDULE, "--train-iters", "4",
                                "--split", "99,1,0", "--num-workers", workers))
    took = ends_after_error(job, rf"^error: rank \d: ValueError: dataset {re.escape(prefix)}: document \d+ holds "
                                 rf"token id [\d,]+, beyond the 8,192 ids of the tokenizer", mark=r"^error: ")
    print(f"job ended {took:.1f} s after the error line")
    assert ("Caught ValueError in DataLoader worker process" in job.output) == (workers != "0")
