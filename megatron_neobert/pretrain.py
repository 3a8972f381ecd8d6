"""Pre-train NeoBERT with megatron-core.

    torchrun --nproc-per-node 8 -m megatron_neobert.pretrain --data-path data/refinedweb_content_document \
        --tokenizer-model bert-base-uncased --bf16 --use-distributed-optimizer --save ckpt --load ckpt

Data flow of a step: the loader yields this data-parallel rank's micro-batches of the global batch;
megatron-core's schedule (no pipelining, 1F1B or interleaved 1F1B) runs forward/backward over them
on every model chunk; DDP reduces the gradients (calculate_per_token_loss: divided once by the
global number of masked tokens); the optimizer steps unless the loss or a gradient is not finite.

As a library: `train(parse_args(argv))` runs on every rank of an initialised (or torchrun)
process group and returns the history of the run (see `train`).
"""

import dataclasses
import logging
import math
import random
import sys
import time
from typing import Callable, List, Optional

import numpy
import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func

from megatron_neobert.kernels import format_report, kernel_report
from megatron_neobert.model import get_arch, padded_vocab_size, transformer_config
from megatron_neobert.parallel.launch import init_distributed, initialize_model_parallel
from megatron_neobert.training.arguments import ARCH_OVERRIDES, parse_args
from megatron_neobert.training.metrics import format_duration, memory_gib, peak_tflops, step_flops
from megatron_neobert.training.model_setup import build_model_chunks
from megatron_neobert.training.profiling import StepProfiler
from megatron_neobert.training.signals import ExitSignalHandler
from megatron_neobert.training.step import micro_batch_tensor_shape, mlm_forward_step, real_tokens
from megatron_neobert.training.trainer_checkpoint import (holds_training_state, load_checkpoint, read_checkpoint,
                                                          save_checkpoint)

logger = logging.getLogger("megatron_neobert.pretrain")

# Settings that define the order of the samples; a checkpoint's data position applies only to the
# same order (a longer --train-iters or another masking keeps it: the epochs' order is the same).
DATA_STREAM_KEYS = ("data_path", "data_args_path", "per_split_data_args_path", "split", "seq_length",
                    "packed", "seed", "tokenizer_type",
                    "tokenizer_model")


class NonFiniteLossError(RuntimeError):
    pass


def print_rank_0(msg: str) -> None:
    if torch.distributed.get_rank() == 0:
        print(msg, flush=True)


# ---- set-up ------------------------------------------------------------------------------------
def model_arch(args):
    overrides = {field: getattr(args, name) for name, field in ARCH_OVERRIDES.items()
                 if getattr(args, name) is not None}
    return get_arch(args.model_preset, **overrides)


def build_scheduler(args, optimizer) -> OptimizerParamScheduler:
    """The recipe's schedule, in iterations: linear warmup from 0, decay to min-lr, then constant."""
    return OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters, lr_decay_steps=args.lr_decay_iters,
        lr_decay_style=args.lr_decay_style, start_wd=args.weight_decay, end_wd=args.weight_decay,
        wd_incr_steps=args.train_iters, wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=not args.override_opt_param_scheduler,
        override_opt_param_scheduler=args.override_opt_param_scheduler)


def padded_model_vocab(args, arch, checkpoint: Optional[str], common: Optional[dict]) -> int:
    """Rows of the embedding and output layer: the vocabulary padded to a multiple of
    --make-vocab-size-divisible-by x TP, as Megatron-LM, or a loaded checkpoint's. 30522 pads to 30592
    at TP 1 but to 30720 at TP 2, and megatron-core loads saved rows into another count without a
    word: it cuts them, or fills zeros (extra zero logits in the softmax: other losses)."""
    tp = args.tensor_model_parallel_size
    saved = common["args"].get("padded_vocab_size") if common else None
    if saved is None:
        return padded_vocab_size(arch.vocab_size, tp, args.make_vocab_size_divisible_by)
    if saved < arch.vocab_size:
        raise ValueError(f"checkpoint {checkpoint} has {saved} vocabulary rows, fewer than the model's "
                         f"vocabulary ({arch.vocab_size}, --vocab-size or the preset's)")
    if saved % tp:
        raise ValueError(f"checkpoint {checkpoint} has its vocabulary padded to {saved} rows, which "
                         f"--tensor-model-parallel-size {tp} does not divide")
    return saved


def setup_model_and_optimizer(args, arch, padded_vocab: int):
    vpp = None
    if args.num_layers_per_virtual_pipeline_stage:
        vpp = arch.num_layers // (args.pipeline_model_parallel_size * args.num_layers_per_virtual_pipeline_stage)
    initialize_model_parallel(args.tensor_model_parallel_size, args.pipeline_model_parallel_size, vpp)
    set_random_seed(args.seed)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    recompute = {}
    if args.recompute_granularity:
        recompute = dict(recompute_granularity=args.recompute_granularity)
        if args.recompute_granularity == "full":
            recompute.update(recompute_method=args.recompute_method,
                             recompute_num_layers=args.recompute_num_layers)
    config = transformer_config(
        arch, tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=vpp, sequence_parallel=args.sequence_parallel,
        bf16=args.bf16, params_dtype=dtype, pipeline_dtype=dtype,
        fp8=args.fp8_format, fp8_recipe=args.fp8_recipe if args.fp8_format else "delayed", **recompute)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather, bucket_size=args.ddp_bucket_size,
        use_distributed_optimizer=args.use_distributed_optimizer)
    chunks = build_model_chunks(arch, config, args.transformer_impl, ddp_config, padded_vocab)
    if args.overlap_param_gather:  # the schedules start each chunk's parameter all-gather
        config.param_sync_func = [c.start_param_sync for c in chunks]
        if len(chunks) == 1:
            config.param_sync_func = config.param_sync_func[0]
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", decoupled_weight_decay=args.optimizer == "adamw", lr=args.lr,
        min_lr=args.min_lr, weight_decay=args.weight_decay, adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2, adam_eps=args.adam_eps, clip_grad=args.clip_grad, bf16=args.bf16,
        params_dtype=dtype, use_distributed_optimizer=args.use_distributed_optimizer), chunks)
    return config, chunks, optimizer, build_scheduler(args, optimizer)


def set_random_seed(seed: int) -> None:
    """As Megatron-LM: one seed per pipeline stage (stages must not start with equal layers);
    the tensor-parallel RNG tracker adds the TP rank for the sharded weights and dropout."""
    seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def build_data(args, consumed_train: int, consumed_valid: int):
    from megatron_neobert.data.loader import build_data_loader
    from megatron_neobert.data.tokenizer import build_tokenizer
    from megatron_neobert.data.trainer_datasets import build_trainer_datasets

    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model)
    train_ds, valid_ds, _ = build_trainer_datasets(args, tokenizer)
    num_evals = args.train_iters // args.eval_interval + 1 if args.eval_interval else 0
    dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
    device_id = torch.cuda.current_device() if torch.cuda.is_available() else None
    loader = lambda ds, consumed: build_data_loader(
        ds, args.micro_batch_size, consumed, dp_rank, dp_size, num_workers=args.num_workers,
        loader=args.data_loader, device_id=device_id)
    valid = loader(valid_ds, consumed_valid) if valid_ds is not None and num_evals and args.eval_iters else None
    return tokenizer, iter(loader(train_ds, consumed_train)), (iter(valid) if valid is not None else None)


# ---- one step ----------------------------------------------------------------------------------
def _poisoned(loss_func):
    """The loss function with a NaN loss, as an overflow would give (the token count stays)."""
    def func(output):
        loss, num_tokens, report = loss_func(output)
        report = {k: torch.cat([v[:1] * float("nan"), v[1:]]) for k, v in report.items()}
        return loss * float("nan"), num_tokens, report
    return func


def run_micro_batches(chunks, batches: List[dict], forward_only: bool, poison: bool = False,
                      pad_id: Optional[int] = None):
    """megatron-core's schedule over this rank's micro-batches; returns the global
    [loss sum, correct, masked count, real (non-padding) tokens] on every rank; the last one
    is 0 without `pad_id`."""
    def forward_step(data_iterator, model):
        output, loss_func = mlm_forward_step(data_iterator, model)
        return output, (_poisoned(loss_func) if poison else loss_func)

    seq_length, mbs = micro_batch_tensor_shape(batches[0])
    iterators = [iter(batches) for _ in chunks]  # every virtual stage reads the same micro-batches
    reports = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iterators if len(chunks) > 1 else iterators[0],
        model=chunks, num_microbatches=len(batches), seq_length=seq_length, micro_batch_size=mbs,
        forward_only=forward_only)
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    stats = torch.zeros(4, dtype=torch.float64, device=device)
    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        for r in reports:
            stats[:3] += r["lm loss"].to(stats)
        if pad_id is not None:
            stats[3] = sum(real_tokens(b, pad_id).to(stats) for b in batches)
        torch.distributed.all_reduce(stats, group=parallel_state.get_data_parallel_group())
    # Only the last stage holds losses: summing over the pipeline hands them to every rank.
    torch.distributed.all_reduce(stats, group=parallel_state.get_pipeline_model_parallel_group())
    return stats


def grads_are_finite(chunks) -> bool:
    """Whether every rank's gradient buffers are finite (a NaN anywhere reaches some rank's
    shard after the reduce(-scatter), so the local buffers plus an all-reduce decide)."""
    bad = any(not torch.isfinite(buf.grad_data).all() for c in chunks for buf in c.buffers)
    flag = torch.tensor([float(bad)], device=chunks[0].buffers[0].grad_data.device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return not flag.item()


def _sync_params(chunks, args):
    # With --overlap-param-gather the distributed optimizer's all-gather of updated parameters
    # happens in the next forward; force it before evaluating or saving.
    if args.overlap_param_gather:
        for c in chunks:
            c.disable_forward_pre_hook(param_sync=True)


def _resume_param_hooks(chunks, args):
    if args.overlap_param_gather:
        for c in chunks:
            c.enable_forward_pre_hook()


def evaluate(chunks, valid_iter, num_micro: int, args) -> dict:
    _sync_params(chunks, args)
    for c in chunks:
        c.eval()
    total = None
    with torch.no_grad():
        for _ in range(args.eval_iters):
            stats = run_micro_batches(chunks, [next(valid_iter) for _ in range(num_micro)], forward_only=True)
            total = stats if total is None else total + stats
    for c in chunks:
        c.train()
    _resume_param_hooks(chunks, args)
    return {"loss": (total[0] / total[2]).item(), "accuracy": (total[1] / total[2]).item()}


# ---- the loop ----------------------------------------------------------------------------------
def train(args, on_step: Optional[Callable[[dict], None]] = None) -> dict:
    """Train on every rank of the process group; returns {"train": [per-step records], "eval":
    [records], "iteration", "exit": "finished" | "signal" | "exit-interval", "skipped"}.

    A per-step record: iteration, loss, accuracy, lr (used by that step), grad_norm, skipped.
    `on_step(record)` is called after each step (progress bars, tests).
    """
    init_distributed()
    arch = model_arch(args)
    checkpoint, common = read_checkpoint(args.load) if args.load else (None, None)
    finetune = args.finetune
    if checkpoint and not finetune and not holds_training_state(common):
        print_rank_0(f"{checkpoint} holds model weights only: starting from iteration 0 as with --finetune")
        finetune = True
    vocab = padded_model_vocab(args, arch, checkpoint, common)
    config, chunks, optimizer, scheduler = setup_model_and_optimizer(args, arch, vocab)
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    dp = parallel_state.get_data_parallel_world_size()
    world = torch.distributed.get_world_size()
    if args.global_batch_size % (args.micro_batch_size * dp):
        raise ValueError(f"--global-batch-size {args.global_batch_size} is not a multiple of "
                         f"--micro-batch-size {args.micro_batch_size} x data-parallel size {dp}")
    num_micro = args.global_batch_size // (args.micro_batch_size * dp)
    print_rank_0(format_report(kernel_report(args.transformer_impl, args.data_loader)))
    print_rank_0(f"layout: {world} ranks = TP {tp} x PP {pp} x DP {dp}"
                 f" (virtual stages per rank {len(chunks)}, sequence parallel "
                 f"{'on' if args.sequence_parallel else 'off'}, distributed optimizer "
                 f"{'on' if args.use_distributed_optimizer else 'off'}); global batch "
                 f"{args.global_batch_size} = micro-batch {args.micro_batch_size} x {num_micro} "
                 f"accumulation x DP {dp}; model {args.model_preset} {arch.num_layers} x "
                 f"{arch.hidden_size}, vocab {arch.vocab_size} (padded {vocab})")

    iteration, consumed, skipped_total, last_saved = 0, 0, 0, None
    if checkpoint:
        load_checkpoint(checkpoint, common, chunks, optimizer, scheduler, load_optimizer=not args.no_load_optim,
                        load_rng=not args.no_load_rng, finetune=finetune)
        if not finetune:
            iteration = last_saved = common["iteration"]
            state = common["train_state"]
            skipped_total = state["skipped_iters"]
            if state["data_stream"] == _data_stream(args):
                consumed = state["consumed_samples"]
            else:  # stage 2: new data or length; the old position means nothing there
                print_rank_0(f"data settings differ from the checkpoint's: reading the new data "
                             f"from its start (checkpoint: {state['data_stream']})")
        print_rank_0(f"loaded {checkpoint} at iteration {iteration}")
    elif args.load:
        print_rank_0(f"no checkpoint in {args.load}: starting from scratch")
    evals_done = iteration // args.eval_interval if args.eval_interval else 0
    tokenizer, train_iter, valid_iter = build_data(
        args, consumed, evals_done * args.eval_iters * args.global_batch_size)
    if tokenizer.vocab_size > arch.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} entries, model preset {arch.vocab_size}")

    writer = None
    if args.tensorboard_dir and torch.distributed.get_rank() == 0:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(args.tensorboard_dir)
    saved_args = dict(vars(args), arch=dataclasses.asdict(arch), padded_vocab_size=vocab,
                      data_parallel_size=dp, world_size=world)

    def save(it):
        _sync_params(chunks, args)
        save_checkpoint(args.save, it, chunks, optimizer, scheduler,
                        dict(consumed_samples=consumed, data_stream=_data_stream(args),
                             skipped_iters=skipped_total), saved_args, args.keep_last_n_checkpoints)
        _resume_param_hooks(chunks, args)
        print_rank_0(f"saved checkpoint at iteration {it} to {args.save}")

    history = {"train": [], "eval": [], "exit": "finished"}
    in_a_row, window = 0, []
    peak = peak_tflops(fp8=args.fp8_format is not None)
    profiler = StepProfiler(args)
    handler = ExitSignalHandler() if args.exit_signal_handler else None
    if handler:
        handler.__enter__()
    t_window = time.perf_counter()
    try:
        while iteration < args.train_iters:
            profiler.step_begins(iteration)
            for c in chunks:
                c.zero_grad_buffer()
            optimizer.zero_grad()
            lr = optimizer.param_groups[0]["lr"]
            batches = [next(train_iter) for _ in range(num_micro)]
            stats = run_micro_batches(chunks, batches, forward_only=False,
                                      poison=iteration + 1 in args.inject_nonfinite_at,
                                      pad_id=tokenizer.pad_id)
            iteration += 1
            consumed += args.global_batch_size
            loss = (stats[0] / stats[2]).item()
            if math.isfinite(loss) and grads_are_finite(chunks):
                ok, grad_norm, _ = optimizer.step()
                assert ok, "megatron-core's optimizer found a non-finite gradient after our check"
                scheduler.step(increment=1)
                in_a_row = 0
            else:
                grad_norm, in_a_row, skipped_total = float("nan"), in_a_row + 1, skipped_total + 1
                print_rank_0(f"iteration {iteration}: non-finite loss or gradient, step skipped "
                             f"({in_a_row} in a row, {skipped_total} in total)")
                if in_a_row > args.max_skipped_iters:
                    raise NonFiniteLossError(
                        f"{in_a_row} consecutive steps with a non-finite loss or gradient (more than "
                        f"--max-skipped-iters {args.max_skipped_iters}); stopping at iteration "
                        f"{iteration} without saving. Last good checkpoint: "
                        f"{args.save if last_saved is not None else 'none'} (iteration {last_saved})")
            profiler.step_ends(iteration)  # the window holds the steps alone, not evaluations or saves
            record = dict(iteration=iteration, loss=loss, accuracy=(stats[1] / stats[2]).item(), lr=lr,
                          grad_norm=float(grad_norm) if grad_norm is not None else None,
                          skipped=in_a_row > 0, predicted=int(stats[2].item()), tokens=int(stats[3].item()))
            history["train"].append(record)
            window.append(record)
            if on_step:
                on_step(record)

            if iteration % args.log_interval == 0 or iteration == args.train_iters:
                elapsed = time.perf_counter() - t_window
                _log(args, arch, vocab, window, elapsed, peak, writer, skipped_total)
                window, t_window = [], time.perf_counter()
            if valid_iter is not None and args.eval_interval and iteration % args.eval_interval == 0:
                result = dict(evaluate(chunks, valid_iter, num_micro, args), iteration=iteration)
                history["eval"].append(result)
                print_rank_0(f" validation at iteration {iteration}: loss {result['loss']:.4f} "
                             f"| accuracy {result['accuracy']:.4f}")
                if writer:
                    writer.add_scalar("validation/loss", result["loss"], iteration)
                    writer.add_scalar("validation/accuracy", result["accuracy"], iteration)

            stop = None
            if handler and handler.any_rank_signalled():
                stop = "signal"
            elif args.exit_interval and iteration % args.exit_interval == 0:
                stop = "exit-interval"
            if args.save and in_a_row == 0 and (
                    stop or iteration == args.train_iters
                    or (args.save_interval and iteration % args.save_interval == 0)):
                save(iteration)
                last_saved = iteration
            if stop:
                print_rank_0(f"stopping at iteration {iteration} ({stop})")
                history["exit"] = stop
                break
        profiler.stop()  # a run stopped inside the window still writes it
    finally:
        if handler:
            handler.__exit__(None, None, None)
        if writer:
            writer.close()
    history.update(iteration=iteration, skipped=skipped_total)
    return history


def _data_stream(args) -> dict:
    return {k: getattr(args, k) for k in DATA_STREAM_KEYS}


def _log(args, arch, vocab, window, elapsed, peak, writer, skipped_total) -> None:
    last = window[-1]
    it, n = last["iteration"], len(window)
    good = [r for r in window if not r["skipped"]]
    loss = sum(r["loss"] for r in good) / max(len(good), 1) if good else float("nan")
    acc = sum(r["accuracy"] for r in good) / max(len(good), 1) if good else float("nan")
    per_step = elapsed / n
    tokens = sum(r["tokens"] for r in window) / n  # real tokens: padding is no work done
    flops = sum(step_flops(arch, r["tokens"], r["predicted"], args.seq_length, vocab) for r in window)
    tflops = flops / elapsed / torch.distributed.get_world_size() / 1e12
    mfu = f"{100 * tflops / peak:.1f}%" if peak else "n/a"
    grad_norm = last["grad_norm"]
    print_rank_0(
        f" iteration {it:8d}/{args.train_iters} | loss {loss:.4f} | accuracy {acc:.4f} | lr {last['lr']:.3e}"
        f" | grad norm {grad_norm if grad_norm is None else f'{grad_norm:.3f}'}"
        f" | tokens/s {tokens / per_step:,.0f} | TFLOP/s/GPU {tflops:.3g} | MFU {mfu}"
        f" | {per_step * 1000:.0f} ms/step | mem {memory_gib():.2f} GiB"
        f" | skipped {skipped_total} | left {format_duration(per_step * (args.train_iters - it))}")
    if writer:
        for name, value in [("train/loss", loss), ("train/accuracy", acc), ("train/lr", last["lr"]),
                            ("train/grad_norm", grad_norm), ("perf/tokens_per_s", tokens / per_step),
                            ("perf/tflops_per_gpu", tflops), ("perf/mfu", tflops / peak if peak else None),
                            ("perf/memory_gib", memory_gib()), ("train/skipped_iters", skipped_total)]:
            if value is not None:
                writer.add_scalar(name, value, it)


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    init_distributed()
    try:
        history = train(args)
        print_rank_0(f"done: iteration {history['iteration']} ({history['exit']})")
        return 0
    except NonFiniteLossError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
