"""Trainer runs for the tests, at module level so that spawned gloo ranks can import them."""

import contextlib
import errno
import logging
import os
import socket
import signal
import time

import torch
from megatron.core import dist_checkpointing
from megatron.core.utils import unwrap_model

from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.training.engine import trainer
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.parallel.cpu import cpu_execution
from megatron_neobert.checkpoint.state import load_model_state, model_sharded_state_dict
from megatron_neobert.training.engine.entry import train
from megatron_neobert.errors import TrainingError
from megatron_neobert.training.engine.train_step import NonFiniteLossError
from megatron_neobert.model.chunks import build_model_chunks
from megatron_neobert.training.engine.model_setup import run_model_shape
from megatron_neobert.training.engine.forward_step import mlm_forward_step
from megatron_neobert.training.reporting.train_log import configure_logging


def tiny_argv(data_path: str, cache: str, *extra: str) -> list:
    """The tiny preset cut down to 2-4 layers of 64, length 64: a step takes well under a second."""
    return ["--model-preset", "neobert-tiny", "--num-layers", "2", "--hidden-size", "64",
            "--num-attention-heads", "4", "--ffn-hidden-size", "128", "--seq-length", "64",
            "--data-path", data_path, "--data-cache-path", cache, "--tokenizer-model", SAMPLE_TOKENIZER,
            "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "3e-3", "--lr-warmup-iters", "2",
            "--log-interval", "4", "--eval-interval", "1000", "--eval-iters", "1", "--num-workers", "0",
            "--seed", "7", *extra]


@contextlib.contextmanager
def as_the_entry_point():
    """What the trainer's entry point (pretrain.main) sets up around train(): its console, and megatron-core's CUDA
    calls on the CPU where there is no GPU."""
    configure_logging()
    with cpu_execution():
        yield


def run_train(argv: list) -> dict:
    """The trainer on `argv`, as its entry point runs it (here or on a rank of run_on_ranks)."""
    with as_the_entry_point():
        return train(parse_settings(argv))


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def log_lines():
    """The package's log messages (every rank's, at INFO and above) written inside the block, as a list."""
    handler, package = _Lines(), logging.getLogger("megatron_neobert")
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        package.removeHandler(handler)


def run_train_logged(argv: list) -> tuple:
    """(history, the trainer's log lines) of a run on this rank."""
    with log_lines() as lines:
        return run_train(argv), lines


def run_train_with_a_slow_rank(argv: list, slow_rank: int, slow_steps: range, delay_s: float,
                               save_delay_s: float = 0.0) -> tuple:
    """(history or the TrainingError's message, log lines) of a run on this rank, where `slow_rank` runs on a host
    of its own ("slow-host"), takes `delay_s` longer in each iteration of `slow_steps` (a throttled host) and
    `save_delay_s` longer in each checkpoint save (a slower disk)."""
    slow = int(os.environ["RANK"]) == slow_rank
    if slow:
        socket.gethostname = lambda: "slow-host"  # this rank process only: a host of its own
        save = trainer.save_checkpoint

        def slow_save(*args, **kwargs):
            time.sleep(save_delay_s)
            return save(*args, **kwargs)
        trainer.save_checkpoint = slow_save

    def throttled(record):
        if slow and record["iteration"] in slow_steps:
            time.sleep(delay_s)
    with log_lines() as lines, after_each_step(throttled):
        try:
            return run_train(argv), lines
        except TrainingError as err:
            return str(err), lines


def real_tokens_per_step(argv: list, steps: int) -> list:
    """Non-padding tokens of each of the first `steps` global batches, read straight from the data
    loader on one rank (the trainer's data-parallel ranks share each global batch out)."""
    from megatron_neobert.parallel.launch import initialize_model_parallel
    from megatron_neobert.training.engine.data_setup import build_data

    initialize_model_parallel(1, 1)
    settings = parse_settings(argv)
    tokenizer, batches, _ = build_data(settings, 0, 0)
    micro_batches = settings.training.global_batch_size // settings.training.micro_batch_size
    return [sum(int((next(batches)["tokens"] != tokenizer.pad_id).sum()) for _ in range(micro_batches))
            for _ in range(steps)]


@contextlib.contextmanager
def after_each_step(callback):
    """Inside the block, the trainer calls `callback(record)` after each training step (its train_step, wrapped)."""
    step = trainer.train_step

    def train_step(*args, **kwargs):
        record = step(*args, **kwargs)
        callback(record)
        return record
    trainer.train_step = train_step
    try:
        yield
    finally:
        trainer.train_step = step


def run_train_with_slow_saves(argv: list, delay_s: float) -> dict:
    """The trainer on `argv`, each checkpoint save `delay_s` longer (a slower file system)."""
    save = trainer.save_checkpoint

    def slow_save(*args, **kwargs):
        time.sleep(delay_s)
        return save(*args, **kwargs)
    trainer.save_checkpoint = slow_save
    try:
        return run_train(argv)
    finally:
        trainer.save_checkpoint = save


def process_memory_and_threads() -> dict:
    """This process's anonymous resident memory (bytes: what it allocated, without the pages of the files it maps,
    which the kernel shares and reclaims), file-backed resident memory, and thread count."""
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {"rss_anon": int(status["RssAnon"].split()[0]) * 1024, "rss_file": int(status["RssFile"].split()[0]) * 1024,
            "threads": int(status["Threads"])}


def run_train_sampling_memory(argv: list, at: tuple) -> tuple:
    """(history, {iteration: process_memory_and_threads()} after each iteration of `at`)."""
    samples = {}

    def sample(record):
        if record["iteration"] in at:
            samples[record["iteration"]] = process_memory_and_threads()
    with after_each_step(sample):
        return run_train(argv), samples


def run_train_with_signal(argv: list, rank: int, at_iteration: int, signum=signal.SIGTERM) -> dict:
    """Train; one rank sends itself `signum` after `at_iteration` (as a cluster scheduler would)."""
    def on_step(record):
        if record["iteration"] == at_iteration and torch.distributed.get_rank() == rank:
            os.kill(os.getpid(), signum)
    with after_each_step(on_step), as_the_entry_point():
        return train(parse_settings(argv))


def run_train_until_nonfinite(argv: list, nonfinite_at: list):
    """(per-step records, error message) of a run whose loss is NaN at the iterations `nonfinite_at`
    (as an overflow would make it; the masked-token count stays), stopped by too many of them."""
    records = []

    def poisoned(loss_func):
        def func(output):
            loss, num_tokens, report = loss_func(output)
            report = {k: torch.cat([v[:1] * float("nan"), v[1:]]) for k, v in report.items()}
            return loss * float("nan"), num_tokens, report
        return func

    def forward_step(data_iterator, model):
        output, loss_func = mlm_forward_step(data_iterator, model)
        next_iteration = len(records) + 1
        return output, (poisoned(loss_func) if next_iteration in nonfinite_at else loss_func)

    try:
        with after_each_step(records.append), as_the_entry_point():
            train(parse_settings(argv), forward_step=forward_step)
    except NonFiniteLossError as err:
        return records, str(err)
    return records, None


def read_weights(argv: list, checkpoint_dirs: list) -> list:
    """The full (TP=1, PP=1) state dicts of the models in iteration folders."""
    from megatron_neobert.parallel.launch import initialize_model_parallel
    from megatron_neobert.model import transformer_config

    settings = parse_settings(argv)
    initialize_model_parallel(1, 1)
    shape = run_model_shape(settings)
    chunks = build_model_chunks(shape.arch, transformer_config(shape.arch), "local", shape.padded_vocab_size)
    weights = []
    for path in checkpoint_dirs:
        load_model_state(chunks, dist_checkpointing.load(model_sharded_state_dict(chunks), path))
        weights.append({k: v.clone() for k, v in unwrap_model(chunks[0]).state_dict().items()
                        if "_extra_state" not in k})
    return weights


class FullDisk:
    """A file that runs out of space after 64 KB, as on a full disk: past the small pickled items a
    checkpoint file starts with, inside the torch.save of a tensor (which hides the OSError)."""

    def __init__(self, file):
        self.file, self.left = file, 64 << 10

    def write(self, data):
        if len(data) > self.left:
            self.file.write(bytes(data)[:self.left])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def full_disk_open(path: str, mode: str) -> FullDisk:
    """`open` for megatron-core's checkpoint writers (forked: a patch in the rank reaches them)."""
    return FullDisk(open(path, mode))
