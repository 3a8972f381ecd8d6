"""What the trainer prints and writes to TensorBoard: a console line every --log-interval steps
(loss, accuracy, lr, grad norm, tokens/s, TFLOP/s, MFU, memory, time left) and the validations."""

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
        self.window: List[dict] = []
        self.writer = None
        if args.tensorboard_dir and torch.distributed.get_rank() == 0:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(args.tensorboard_dir)

    def step(self, record: dict, elapsed: Optional[float], skipped_total: int) -> None:
        """Add a step's record; with `elapsed` (seconds since the window began) report the window."""
        self.window.append(record)
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
        if self.writer:
            for name, value in [("train/loss", loss), ("train/accuracy", acc), ("train/lr", last["lr"]),
                                ("train/grad_norm", grad_norm), ("perf/tokens_per_s", tokens / per_step),
                                ("perf/tflops_per_gpu", tflops),
                                ("perf/mfu", tflops / self.peak if self.peak else None),
                                ("perf/memory_gib", memory_gib()), ("train/skipped_iters", skipped_total)]:
                if value is not None:
                    self.writer.add_scalar(name, value, it)

    def evaluation(self, result: dict) -> None:
        print_rank_0(f" validation at iteration {result['iteration']}: loss {result['loss']:.4f} "
                     f"| accuracy {result['accuracy']:.4f}")
        if self.writer:
            self.writer.add_scalar("validation/loss", result["loss"], result["iteration"])
            self.writer.add_scalar("validation/accuracy", result["accuracy"], result["iteration"])

    def close(self) -> None:
        if self.writer:
            self.writer.close()
