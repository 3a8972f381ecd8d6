"""What the trainer prints and writes to TensorBoard and wandb: a console line every --log-interval
steps (loss, accuracy, lr, grad norm, tokens/s, TFLOP/s, MFU, memory, time left) and the validations.

TensorBoard / wandb tags are Megatron-LM's, so its dashboards read them: every step "lm loss",
"learning-rate", "batch-size", "grad-norm", "loss-scale" (--fp16) and their "... vs samples"; every
--log-interval "iteration-time" (seconds per step) and, with --log-throughput, "throughput"
(TFLOP/s per GPU); each validation "lm loss validation" (and "... vs samples"). The project's own
figures go under train/, perf/ and validation/.
"""

import os
from typing import List, Optional

import torch

from megatron_neobert.model import NeoBERTArch
from megatron_neobert.training.metrics import format_duration, memory_gib, peak_tflops, step_flops


def print_rank_0(msg: str) -> None:
    if torch.distributed.get_rank() == 0:
        print(msg, flush=True)


class TrainingLog:
    """Collects the step records of a logging window and reports them; rank 0 writes."""

    def __init__(self, args, arch: NeoBERTArch, padded_vocab: int):
        self.args, self.arch, self.padded_vocab = args, arch, padded_vocab
        self.peak = peak_tflops(fp8=args.fp8_format is not None)
        if self.peak is None and torch.cuda.is_available():
            print_rank_0(f"MFU not reported: no {'FP8' if args.fp8_format else 'bf16'} peak TFLOP/s known for "
                         f"{torch.cuda.get_device_name()!r} (training/metrics.py PEAK_TFLOPS)")
        self.window: List[dict] = []
        self.writers = []  # each with add_scalar(tag, value, step) and close()
        if torch.distributed.get_rank() == 0:
            if args.tensorboard_dir:
                from torch.utils.tensorboard import SummaryWriter
                self.writers.append(SummaryWriter(args.tensorboard_dir))
            if args.wandb_project:
                self.writers.append(WandbWriter(args))

    def _scalars(self, step: int, values) -> None:
        for name, value in values:
            if value is not None:
                for writer in self.writers:
                    writer.add_scalar(name, value, step)

    def step(self, record: dict, elapsed: Optional[float], skipped_total: int) -> None:
        """Add a step's record; with `elapsed` (seconds since the window began) report the window."""
        self.window.append(record)
        it, samples = record["iteration"], record["consumed_samples"]
        good = not record["skipped"]
        for name, value in [("lm loss", record["loss"] if good else None), ("learning-rate", record["lr"]),
                            ("batch-size", self.args.global_batch_size),
                            ("grad-norm", record["grad_norm"] if good else None),
                            ("loss-scale", record["loss_scale"])]:
            self._scalars(it, [(name, value)])
            self._scalars(samples, [(f"{name} vs samples", value)])
        if elapsed is not None:
            self._report(elapsed, skipped_total)
            self.window = []

    def _report(self, elapsed: float, skipped_total: int) -> None:
        args, window = self.args, self.window
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
        mfu = f"{100 * tflops / self.peak:.1f}%" if self.peak else "n/a"
        grad_norm = last["grad_norm"]
        print_rank_0(
            f" iteration {it:8d}/{args.train_iters} | loss {loss:.4f} | accuracy {acc:.4f} | lr {last['lr']:.3e}"
            f" | grad norm {grad_norm if grad_norm is None else f'{grad_norm:.3f}'}"
            f" | tokens/s {tokens / per_step:,.0f} | TFLOP/s/GPU {tflops:.3g} | MFU {mfu}"
            f" | {per_step * 1000:.0f} ms/step | mem {memory_gib():.2f} GiB"
            f" | skipped {skipped_total} | left {format_duration(per_step * (args.train_iters - it))}")
        self._scalars(it, [("iteration-time", per_step), ("throughput", tflops if args.log_throughput else None),
                           ("train/accuracy", acc), ("perf/tokens_per_s", tokens / per_step),
                           ("perf/tflops_per_gpu", tflops), ("perf/mfu", tflops / self.peak if self.peak else None),
                           ("perf/memory_gib", memory_gib()), ("train/skipped_iters", skipped_total)])

    def evaluation(self, result: dict) -> None:
        print_rank_0(f" validation at iteration {result['iteration']}: loss {result['loss']:.4f} "
                     f"| accuracy {result['accuracy']:.4f}")
        self._scalars(result["iteration"], [("lm loss validation", result["loss"]),
                                            ("validation/accuracy", result["accuracy"])])
        self._scalars(result["consumed_samples"], [("lm loss validation vs samples", result["loss"])])

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class WandbWriter:
    """Weights & Biases as Megatron-LM sets it up: project, run name, files under --wandb-save-dir
    (default --save/wandb), the arguments as the run's config. WANDB_MODE=offline writes locally."""

    def __init__(self, args):
        import wandb  # present: the arguments' check found it
        save_dir = args.wandb_save_dir or os.path.join(args.save, "wandb")
        os.makedirs(save_dir, exist_ok=True)
        self.run = wandb.init(dir=save_dir, name=args.wandb_exp_name, project=args.wandb_project,
                              config=vars(args))

    def add_scalar(self, name: str, value: float, step: int) -> None:
        if name.endswith(" vs samples"):  # wandb's step only increases: the iteration is it (as Megatron-LM)
            return
        self.run.log({name: value}, step=step)

    def close(self) -> None:
        self.run.finish()
