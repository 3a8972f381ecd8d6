"""The trainer's console lines, read with the field patterns a Megatron-LM log parser uses."""

import math
import re

import pytest

from megatron_neobert.cli import logging_kept
from megatron_neobert.model.config import get_arch
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.training.reporting.goodput import GoodputAccount
from megatron_neobert.training.reporting.train_log import TrainingLog, configure_logging

# What parsers written for Megatron-LM's training_log and evaluate_and_print_results look for.
ITERATION = re.compile(r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration\s+(\d+)/\s*(\d+) \|")
FIELD = r" {}: +([-+.\dE]+|nan) \|"
MEGATRON_FIELDS = ("consumed samples", "elapsed time per iteration \\(ms\\)", "learning rate", "global batch size",
                   "lm loss", "loss scale", "grad norm", "num zeros", "params norm", "number of skipped iterations",
                   "number of nan iterations")
VALIDATION = re.compile(r"^ validation loss at iteration (\d+) \| lm loss value: ([-+.\dE]+) \| "
                        r"lm loss PPL: ([-+.\dE]+) \|")


@pytest.fixture(autouse=True)
def _console_removed_after():
    """configure_logging's handlers and INFO level go with each test, as with the trainer's main: left behind,
    they let every later test's INFO lines through (into caplog, onto stdout)."""
    with logging_kept():
        yield


class _TenDayOldJob(GoodputAccount):
    """A job that began 10 days before each of its goodput's readings, 40% of it in productive steps."""

    def __init__(self):
        super().__init__(0.0)
        self.add("productive", 345600.0, 100)

    def wall(self, now: float) -> float:
        return 864000.0


ACCOUNT = _TenDayOldJob()


def _record(iteration, loss, lr, skipped=False):
    return dict(iteration=iteration, loss=loss, accuracy=0.25, lr=lr, logged_lr=lr / 2, grad_norm=1.4375,
                skipped=skipped, predicted=40, tokens=200, attended=4000, consumed_samples=32 * iteration,
                global_batch_size=32, loss_scale=None, num_zeros=17, params_norm=123.4567)


def _parse(line):
    head = ITERATION.match(line)
    assert head, line
    values = {}
    for name in MEGATRON_FIELDS:
        found = re.search(FIELD.format(name), line)
        assert found, (name, line)
        values[name.replace("\\", "")] = float(found.group(1))
    starts = [line.index(name.replace("\\", "") + ":") for name in MEGATRON_FIELDS]
    assert starts == sorted(starts), line  # in Megatron-LM's order
    # Megatron-LM's fields come first: ours only after "number of nan iterations".
    assert line.index("number of nan iterations") < line.index("accuracy:") < line.index("tokens/s:")
    return (int(head.group(1)), int(head.group(2))), values


def test_iteration_and_validation_lines_read_as_megatron_lm_logs(single_rank, capsys):
    configure_logging()  # the trainer's console: rank 0's INFO lines on stdout
    settings = parse_settings(["--mock-data", "--global-batch-size", "32", "--train-iters", "6",
                               "--lr-warmup-iters", "0", "--log-params-norm", "--log-num-zeros-in-grad"])
    log = TrainingLog(settings, get_arch("neobert-tiny"), padded_vocab=8192)
    log.step(_record(1, 10.25, 1e-4), None, 0, ACCOUNT)
    log.step(_record(2, 10.75, 2e-4), None, 0, ACCOUNT)
    log.step(_record(3, float("nan"), 3e-4, skipped=True), 0.5, 1, ACCOUNT)
    log.evaluation(dict(iteration=3, loss=2.5, accuracy=0.5, consumed_samples=96))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and set(lines[1]) == set(lines[3]) == {"-"} and len(lines[1]) == len(lines[2]) + 1

    (it, total), values = _parse(lines[0])
    assert (it, total) == (3, 6)
    assert values["consumed samples"] == 96 and values["global batch size"] == 32
    assert values["elapsed time per iteration (ms)"] == pytest.approx(500 / 3, abs=0.05)
    assert values["lm loss"] == pytest.approx(10.5)  # the window's steps taken, as Megatron-LM averages
    assert values["learning rate"] == 1.5e-4  # the lr after the last step's scheduler update
    assert values["loss scale"] == 1.0 and values["grad norm"] == 1.438
    assert values["num zeros"] == 17 and values["params norm"] == 123.457
    assert values["number of skipped iterations"] == 1 and values["number of nan iterations"] == 1

    found = VALIDATION.match(lines[2])
    assert found, lines[2]
    assert (int(found.group(1)), float(found.group(2))) == (3, 2.5)
    assert float(found.group(3)) == pytest.approx(math.exp(2.5), rel=1e-6)


class _Scalars:
    """A TensorBoard writer that keeps what it is given."""

    def __init__(self):
        self.written, self.last = [], {}

    def add_scalar(self, tag, value, step):
        self.written.append((tag, step))
        self.last[tag] = value

    def close(self):
        pass


def test_the_batch_size_is_each_steps(single_rank, capsys):
    """During a --rampup-batch-size ramp the line's `global batch size` and TensorBoard's `batch-size` are the
    step's, as Megatron-LM's (micro-batches x micro-batch size x DP), not --global-batch-size."""
    _, last = _report(["--train-iters", "10"], [dict(_record(1, 10.0, 1e-4), global_batch_size=8)], 1.0)
    assert "| global batch size:     8 |" in capsys.readouterr().out and last["batch-size"] == 8


def test_tensorboard_tags_follow_megatron_lms_flags(single_rank, capsys):
    base = ["--mock-data", "--global-batch-size", "32", "--train-iters", "6", "--lr-warmup-iters", "0"]
    written = {}
    for name, flags in (("default", []), ("flags", ["--tensorboard-log-interval", "2", "--log-timers-to-tensorboard",
                                                    "--log-world-size-to-tensorboard",
                                                    "--no-log-loss-scale-to-tensorboard",
                                                    "--log-validation-ppl-to-tensorboard"])):
        log = TrainingLog(parse_settings(base + flags), get_arch("neobert-tiny"), padded_vocab=8192)
        log.writers.append(_Scalars())
        for it in range(1, 5):
            log.step(_record(it, 10.0, 1e-4), 0.5 if it % 2 == 0 else None, 0, ACCOUNT)
        log.evaluation(dict(iteration=4, loss=2.5, accuracy=0.5, consumed_samples=128))
        written[name] = log.writers[-1].written
    default, flagged = ({tag for tag, _ in w} for w in (written["default"], written["flags"]))
    assert {"lm loss", "loss-scale", "learning-rate"} <= default
    assert not {"iteration-time", "world-size", "lm loss validation ppl"} & default
    assert {"iteration-time", "world-size", "lm loss validation ppl"} <= flagged and "loss-scale" not in flagged
    assert sorted(step for tag, step in written["default"] if tag == "lm loss") == [1, 2, 3, 4]
    assert sorted(step for tag, step in written["flags"] if tag == "lm loss") == [2, 4]  # every 2nd iteration


def _report(flags, records, elapsed):
    """The console line a window of `records` ending in `elapsed` seconds gives, and the last value of each tag."""
    configure_logging()  # the trainer's console: rank 0's INFO lines on stdout
    log = TrainingLog(parse_settings(["--mock-data", "--global-batch-size", "32", "--lr-warmup-iters", "0", *flags]),
                      get_arch("neobert-tiny"), padded_vocab=8192)
    log.writers.append(_Scalars())
    for record in records[:-1]:
        log.step(record, None, 0, ACCOUNT)
    log.step(records[-1], elapsed, sum(r["skipped"] for r in records), ACCOUNT)
    return log, log.writers[-1].last


def test_our_figures_follow_on_the_line(single_rank, capsys):
    """3 steps of 200 real tokens in 0.5 s, of a run of 1003 steps: 1,200 tokens/s and 1000 steps of 1/6 s left."""
    log, last = _report(["--train-iters", "1003", "--log-throughput", "--log-timers-to-tensorboard"],
                        [_record(it, 10.0, 1e-4) for it in (1, 2, 3)], 0.5)
    line = capsys.readouterr().out.strip()
    ours = line[line.index("number of nan iterations"):]
    assert "| accuracy: 0.2500 | tokens/s: 1,200 | MFU: n/a | mem (GiB): " in ours  # no peak known on a CPU
    assert ours.endswith("| time left: 00:02:46 | goodput: 40.0% |")
    assert last["perf/tokens_per_s"] == pytest.approx(1200) and last["iteration-time"] == pytest.approx(1 / 6)
    tflops = last["perf/tflops_per_gpu"]
    assert tflops > 0 and last["throughput"] == tflops
    assert last["goodput/goodput"] == pytest.approx(0.4, abs=1e-3) and last["goodput/productive_s"] == 345600.0
    assert f"throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |" in line and "perf/mfu" not in last

    log.peak = tflops * 4  # a device whose peak is 4x what the window reached
    log.step(_record(4, 10.0, 1e-4), 0.5 / 3, 0, ACCOUNT)
    assert "| MFU: 25.0% |" in capsys.readouterr().out and log.writers[-1].last["perf/mfu"] == pytest.approx(0.25)

    log.peak, log.bf16_peak = tflops * 8, tflops * 4  # FP8: twice the bf16 peak, for the linears alone
    log.step(_record(5, 10.0, 1e-4), 0.5 / 3, 0, ACCOUNT)
    assert "| MFU: 12.5% of FP8 peak (25.0% of bf16 peak) |" in capsys.readouterr().out


def test_a_window_of_skipped_steps_leaves_out_the_loss_and_counts_them(single_rank, capsys):
    skipped = [dict(_record(it, float("nan"), 1e-4, skipped=True), grad_norm=None, loss_scale=4096.0)
               for it in (1, 2)]
    _report(["--train-iters", "10"], skipped, 1.0)
    line = capsys.readouterr().out
    assert "lm loss" not in line and "grad norm" not in line and "| loss scale: 4096.0 |" in line
    assert "| number of skipped iterations:   2 | number of nan iterations:   2 | accuracy: nan |" in line

    _report(["--train-iters", "10"], [_record(1, 0.0, 1e-4)], 1.0)  # not positive: left out, as Megatron-LM
    assert "lm loss" not in capsys.readouterr().out
