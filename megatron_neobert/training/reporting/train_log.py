"""What the trainer prints and writes to TensorBoard and wandb: a console line every --log-interval
steps and the validations.

The console lines are Megatron-LM's, field for field and number format for number format, so its log
parsers read them; the project's own figures follow Megatron-LM's fields on the same line:

 [2026-11-25 15:20:01] iteration        6/       6 | consumed samples:          192 | elapsed time per
 iteration (ms): 233.1 | learning rate: 1.000000E-05 | global batch size:    32 | lm loss: 1.021100E+01 |
 loss scale: 1.0 | grad norm: 1.436 | number of skipped iterations:   0 | number of nan iterations:   0 |
 accuracy: 0.0120 | tokens/s: 8,800 | MFU: n/a | mem (GiB): 0.42 | time left: 00:00:00 | goodput: 71.3% |
 validation loss at iteration 6 | lm loss value: 1.019000E+01 | lm loss PPL: 2.663000E+04 | accuracy: 0.0130 |
(each line one line; the validation line between two lines of dashes, as Megatron-LM prints it).

TensorBoard / wandb tags are Megatron-LM's, behind its flags, so its dashboards read them: every
--tensorboard-log-interval steps "learning-rate", "batch-size", "lm loss", "loss-scale" (unless
--no-log-loss-scale-to-tensorboard), "world-size", "grad-norm", "num-zeros", "params-norm", "mem-*"
and their "... vs samples"; with --log-timers-to-tensorboard, every --log-interval "iteration-time"
(seconds per step) and, with --log-throughput, "throughput" (TFLOP/s per GPU); each validation
"lm loss validation" and "lm loss validation ppl" (and "... vs samples"). The project's own figures
go under train/, perf/, validation/ and goodput/ (the job's goodput and each category's seconds so far:
`training/reporting/goodput.py`).

Every message of the package goes through its module's logger; `configure_logging` sets up the console
once: INFO lines on stdout from rank 0 alone (as Megatron-LM's print_rank_0), warnings and errors on
stderr from every rank.
"""

import logging
import math
import os
import sys
import time
from datetime import datetime
from typing import List, Optional

import torch

from megatron_neobert.model import NeoBERTArch
from megatron_neobert.training.reporting.goodput import GoodputAccount
from megatron_neobert.training.reporting.metrics import format_duration, memory_gib, peak_tflops, step_flops


logger = logging.getLogger(__name__)
# `extra` of a line each rank says about itself (a profiled rank's operators): not filtered to rank 0.
EVERY_RANK = {"every_rank": True}


def _rank() -> int:
    """This process's rank: the process group's, or before it exists the launcher's RANK."""
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", 0))


class _Console(logging.StreamHandler):
    """Writes to sys.stdout or sys.stderr as it is at each line (a test's capture replaces it); INFO lines
    only from rank 0 (or with EVERY_RANK), and on stdout only those below WARNING."""

    def __init__(self, stream_name: str, level: int, fmt: str):
        super().__init__()
        self.stream_name = stream_name
        self.setLevel(level)
        self.setFormatter(logging.Formatter(fmt))

    def filter(self, record: logging.LogRecord) -> bool:
        if self.stream_name == "stdout" and record.levelno >= logging.WARNING:
            return False
        if record.levelno < logging.WARNING and not getattr(record, "every_rank", False) and _rank() != 0:
            return False
        return super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = getattr(sys, self.stream_name)
        super().emit(record)


def configure_logging() -> None:
    """The trainer's console (once per process): megatron_neobert's INFO lines as they are written, on
    stdout; every library's warnings and errors as "LEVEL logger: message" on stderr."""
    root = logging.getLogger()
    if any(isinstance(handler, _Console) for handler in root.handlers):
        return
    root.addHandler(_Console("stdout", logging.INFO, "%(message)s"))
    root.addHandler(_Console("stderr", logging.WARNING, "%(levelname)s %(name)s: %(message)s"))
    logging.getLogger("megatron_neobert").setLevel(logging.INFO)


class TrainingLog:
    """Collects the step records of a logging window and reports them; rank 0 writes."""

    def __init__(self, settings, arch: NeoBERTArch, padded_vocab: int):
        self.settings, self.arch, self.padded_vocab = settings, arch, padded_vocab
        self.options = settings.logging
        fp8 = settings.precision.fp8_format is not None
        self.peak = peak_tflops(fp8=fp8)
        # FP8 runs only the layers' linears in FP8 (attention, the head and the norms stay bf16): their MFU is
        # given against both peaks, the FP8 one understating it, the bf16 one overstating it.
        self.bf16_peak = peak_tflops(fp8=False) if fp8 else None
        if self.peak is None and torch.cuda.is_available():
            logger.info(f"MFU not reported: no {'FP8' if fp8 else 'bf16'} peak TFLOP/s known for "
                        f"{torch.cuda.get_device_name()!r} (training/reporting/metrics.py PEAK_TFLOPS)")
        self.window: List[dict] = []
        self.writers = []  # each with add_scalar(tag, value, step) and close()
        if torch.distributed.get_rank() == 0:
            if self.options.tensorboard_dir:
                from torch.utils.tensorboard import SummaryWriter
                self.writers.append(SummaryWriter(self.options.tensorboard_dir))
            if self.options.wandb_project:
                self.writers.append(WandbWriter(settings))

    def scalars(self, step: int, values) -> None:
        """Rank 0 writes each (tag, value) whose value is not None at `step`."""
        for name, value in values:
            if value is not None:
                for writer in self.writers:
                    writer.add_scalar(name, value, step)

    def step(self, record: dict, elapsed: Optional[float], skipped_total: int, account: GoodputAccount) -> None:
        """Add a step's record; with `elapsed` (seconds since the window began) report the window, with the goodput
        of the job so far (`account`)."""
        self.window.append(record)
        if record["iteration"] % self.options.tensorboard_log_interval == 0:
            self._step_scalars(record)
        if elapsed is not None:
            self._report(elapsed, skipped_total, account)
            self.window = []

    def _step_scalars(self, record: dict) -> None:
        """Megatron-LM's per-step tags, each also "... vs samples"; the optional ones behind its flags."""
        options, good = self.options, not record["skipped"]
        values = [("learning-rate", record["logged_lr"]), ("batch-size", record["global_batch_size"]),
                  ("lm loss", record["loss"] if good else None)]
        if options.log_loss_scale_to_tensorboard:
            values.append(("loss-scale", record["loss_scale"] or 1.0))
        if options.log_world_size_to_tensorboard:
            values.append(("world-size", torch.distributed.get_world_size()))
        values += [("grad-norm", record["grad_norm"] if good else None), ("num-zeros", record["num_zeros"]),
                   ("params-norm", record["params_norm"])]
        if options.log_memory_to_tensorboard and torch.cuda.is_available():
            stats = torch.cuda.memory_stats()
            values += [("mem-reserved-bytes", stats["reserved_bytes.all.current"]),
                       ("mem-allocated-bytes", stats["allocated_bytes.all.current"]),
                       ("mem-max-allocated-bytes", stats["allocated_bytes.all.peak"]),
                       ("mem-allocated-count", stats["allocation.all.current"])]
        self.scalars(record["iteration"], values)
        self.scalars(record["consumed_samples"], [(f"{name} vs samples", value) for name, value in values])

    def _report(self, elapsed: float, skipped_total: int, account: GoodputAccount) -> None:
        options, training, window = self.options, self.settings.training, self.window
        last = window[-1]
        it, n = last["iteration"], len(window)
        good = [r for r in window if not r["skipped"]]
        loss = sum(r["loss"] for r in good) / len(good) if good else float("nan")
        acc = sum(r["accuracy"] for r in good) / len(good) if good else float("nan")
        per_step = elapsed / n
        tokens = sum(r["tokens"] for r in window) / n  # real tokens: padding is no work done
        flops = sum(step_flops(self.arch, r["tokens"], r["predicted"], r["attended"], self.padded_vocab)
                    for r in window)
        tflops = flops / elapsed / torch.distributed.get_world_size() / 1e12
        fields = [f"consumed samples: {last['consumed_samples']:12d}",
                  f"elapsed time per iteration (ms): {per_step * 1000.0:.1f}"]
        if options.log_throughput:
            fields.append(f"throughput per GPU (TFLOP/s/GPU): {tflops:.1f}")
        fields += [f"learning rate: {last['logged_lr']:.6E}", f"global batch size: {last['global_batch_size']:5d}"]
        if good and loss > 0.0:  # Megatron-LM leaves out a loss whose average is not positive
            fields.append(f"lm loss: {loss:.6E}")
        fields.append(f"loss scale: {last['loss_scale'] or 1.0:.1f}")
        if last["grad_norm"] is not None:
            fields.append(f"grad norm: {last['grad_norm']:.3f}")
        if last["num_zeros"] is not None:
            fields.append(f"num zeros: {last['num_zeros']}")
        if last["params_norm"] is not None:
            fields.append(f"params norm: {last['params_norm']:.3f}")
        # Both counts are the window's, as Megatron-LM's; the run's total of skipped steps is on TensorBoard.
        fields += [f"number of skipped iterations: {n - len(good):3d}",
                   f"number of nan iterations: {sum(not math.isfinite(r['loss']) for r in window):3d}",
                   f"accuracy: {acc:.4f}", f"tokens/s: {tokens / per_step:,.0f}",
                   self._mfu(tflops),
                   f"mem (GiB): {memory_gib():.2f}",
                   f"time left: {format_duration(per_step * (training.train_iters - it))}",
                   f"goodput: {100 * account.goodput(time.time()):.1f}%"]
        logger.info(f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}] iteration {it:8d}/{training.train_iters:8d} |"
                    + "".join(f" {field} |" for field in fields))
        if options.log_timers_to_tensorboard:  # as Megatron-LM: both only with this flag
            self.scalars(it, [("iteration-time", per_step),
                               ("throughput", tflops if options.log_throughput else None)])
        self.scalars(it, [("train/accuracy", acc), ("perf/tokens_per_s", tokens / per_step),
                           ("perf/tflops_per_gpu", tflops), ("perf/mfu", tflops / self.peak if self.peak else None),
                           ("perf/memory_gib", memory_gib()), ("train/skipped_iters", skipped_total)])
        self.scalars(it, account.scalars(time.time()))

    def _mfu(self, tflops: float) -> str:
        if not self.peak:
            return "MFU: n/a"
        if self.bf16_peak is None:
            return f"MFU: {100 * tflops / self.peak:.1f}%"
        return f"MFU: {100 * tflops / self.peak:.1f}% of FP8 peak ({100 * tflops / self.bf16_peak:.1f}% of bf16 peak)"

    def evaluation(self, result: dict) -> None:
        line = (f" validation loss at iteration {result['iteration']} | lm loss value: {result['loss']:.6E} |"
                f" lm loss PPL: {math.exp(min(20, result['loss'])):.6E} | accuracy: {result['accuracy']:.4f} |")
        logger.info("\n".join(["-" * (len(line) + 1), line, "-" * (len(line) + 1)]))
        values = [("lm loss validation", result["loss"])]
        if self.options.log_validation_ppl_to_tensorboard:
            values.append(("lm loss validation ppl", math.exp(min(20, result["loss"]))))
        self.scalars(result["iteration"], values + [("validation/accuracy", result["accuracy"])])
        self.scalars(result["consumed_samples"], [(f"{name} vs samples", value) for name, value in values])

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class WandbWriter:
    """Weights & Biases as Megatron-LM sets it up: project, run name, files under --wandb-save-dir
    (default --save/wandb), the arguments as the run's config. WANDB_MODE=offline writes locally."""

    def __init__(self, settings):
        import wandb  # present: the settings' check found it
        options = settings.logging
        save_dir = options.wandb_save_dir or os.path.join(settings.checkpoint.save, "wandb")
        os.makedirs(save_dir, exist_ok=True)
        self.run = wandb.init(dir=save_dir, name=options.wandb_exp_name, project=options.wandb_project,
                              config=settings.as_dict())

    def add_scalar(self, name: str, value: float, step: int) -> None:
        if name.endswith(" vs samples"):  # wandb's step only increases: the iteration is it (as Megatron-LM)
            return
        self.run.log({name: value}, step=step)

    def close(self) -> None:
        self.run.finish()
