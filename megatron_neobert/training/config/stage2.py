"""Stage 2 from a stage-1 checkpoint: the trainer flags examples/pretrain_neobert_stage2.sh runs with.

NeoBERT's stage 2 goes on from stage 1 (1M steps of 2,048 x 1,024 tokens) for 50k steps of 512 x 4,096: four
times the length, the same 2M tokens per step, 5% more steps. `stage2_plan` applies those ratios to any stage 1,
read from its checkpoint's args: the preset and sizes (--use-checkpoint-args), the tokenizer, the data (unless
other data is given), the ranks, the parallel layout and the optimizer setup whose state loads only into its own
(--bf16, --use-distributed-optimizer), and the schedule it goes on with. The quickstart's stage 1 (neobert-tiny,
16 x 128 tokens per step, 300 steps on 2 ranks) gives 4 x 512 tokens per step for 15 steps on 2 ranks.

The command line: `python -m megatron_neobert.cli.stage2_plan --stage1 ckpt/stage1 --save ckpt/stage2` prints them
as shell assignments.
"""

import dataclasses
import os
from typing import List, Optional

from megatron_neobert.checkpoint.layout import LATEST_MARKER, resolve_checkpoint_dir
from megatron_neobert.errors import InputError

LENGTH_FACTOR = 4  # 1,024 -> 4,096 tokens
STEPS_DIVISOR = 20  # 1M steps -> 50k more
EVALUATIONS = 20  # evaluations (and saves) over stage 2: every 2,500 of the 50k steps


def evaluation_interval(iters: int) -> int:
    """Steps between stage 2's evaluations and saves: EVALUATIONS of them, or only the last step's for a stage 2 of
    fewer steps (after the quickstart's 300, 15), which a checkpoint at every step would only slow down."""
    return iters // EVALUATIONS or iters


@dataclasses.dataclass(frozen=True)
class Stage2Plan:
    ranks: int  # the stage-1 run's world size
    flags: List[str]  # the trainer's
    summary: str  # one line: what stage 2 takes from stage 1, and how long it runs


def _switch(flag: str, on) -> List[str]:
    return [flag] if on else []


def stage2_plan(stage1: str, save: str, load_optim: bool = True, seq_length: Optional[int] = None,
                iters: Optional[int] = None, data_path: Optional[List[str]] = None) -> Stage2Plan:
    """The flags of stage 2 of the run whose checkpoints are in `stage1`, saving to `save`. It loads `save` once
    that holds a checkpoint (a stage 2 that resumes), else stage 1's latest; `load_optim` goes on with stage 1's
    optimizer state and schedule (iterations N+1 .. N+iters), else starts a fresh optimizer on its weights
    (--finetune: iterations 1 .. iters, at stage 1's final learning rate after a 1% warmup). Defaults:
    `seq_length` four times stage 1's, `iters` a twentieth of stage 1's iterations, `data_path` stage 1's."""
    from megatron_neobert.kernels import import_megatron_core

    import_megatron_core()  # quiet: this only reads args
    from megatron_neobert.checkpoint.state import checkpoint_args, read_common_state

    folder = resolve_checkpoint_dir(stage1)
    common = read_common_state(folder)
    args, done = checkpoint_args(common), common["iteration"]
    if args.get("train_samples") is not None:
        raise InputError(f"stage 1 ({folder}) counted its schedule in samples (--train-samples): give stage 2's "
                         f"schedule flags yourself")
    if not (data_path or args.get("data_path")):
        raise InputError(f"stage 1 ({folder}) named its data per split (--train-data-path ...): give stage 2's "
                         f"--data-path")
    seq_length = seq_length or LENGTH_FACTOR * args["seq_length"]
    iters = iters or max(1, done // STEPS_DIVISOR)
    world, tp, pp = args["world_size"], args["tensor_model_parallel_size"], args["pipeline_model_parallel_size"]
    dp = world // (tp * pp)
    # The same tokens per micro-batch and per step as stage 1, in whole micro-batches on every data-parallel rank.
    micro = max(1, args["micro_batch_size"] * args["seq_length"] // seq_length)
    per_step = micro * dp
    global_batch = max(per_step, args["global_batch_size"] * args["seq_length"] // seq_length // per_step * per_step)
    resume = os.path.isfile(os.path.join(save, LATEST_MARKER))
    tokenizer = (["--vocab-file", args["vocab_file"]] if args.get("vocab_file") else
                 ["--tokenizer-type", args["tokenizer_type"], "--tokenizer-model", args["tokenizer_model"]])
    flags = ["--use-checkpoint-args", "--load", save if resume else stage1, "--save", save, *tokenizer,
             "--data-path", *(data_path or args["data_path"]), "--split", args["split"],
             "--seq-length", str(seq_length), "--micro-batch-size", str(micro),
             "--global-batch-size", str(global_batch),
             "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
             "--bf16" if args["bf16"] else "--no-bf16", *_switch("--fp16", args.get("fp16")),
             *_switch("--use-distributed-optimizer", args.get("use_distributed_optimizer")),
             *_switch("--overlap-grad-reduce", args.get("overlap_grad_reduce")),
             *_switch("--overlap-param-gather", args.get("overlap_param_gather"))]
    if args.get("num_layers_per_virtual_pipeline_stage"):
        flags += ["--num-layers-per-virtual-pipeline-stage", str(args["num_layers_per_virtual_pipeline_stage"])]
    if load_optim:  # the checkpoint's schedule goes on (its values win over these, which only have to be valid)
        first, last = done + 1, done + iters
        flags += ["--train-iters", str(last), "--lr", str(args["lr"]), "--min-lr", str(args["min_lr"]),
                  "--lr-decay-style", args["lr_decay_style"]]
        for name in ("lr_warmup_iters", "lr_warmup_fraction", "lr_warmup_samples", "lr_decay_iters",
                     "lr_decay_samples"):
            if args.get(name) is not None:
                flags += ["--" + name.replace("_", "-"), str(args[name])]
    else:
        first, last = 1, iters
        flags += [*_switch("--finetune", not resume), "--train-iters", str(iters), "--lr", str(args["min_lr"]),
                  "--lr-decay-style", "constant", "--lr-warmup-iters", str(iters // 100)]
    every = evaluation_interval(iters)
    flags += ["--log-interval", str(min(args["log_interval"], iters)), "--eval-interval", str(every),
              "--eval-iters", str(args["eval_iters"]), "--save-interval", str(every)]
    summary = (f"stage 2 from {save if resume else folder} (stage 1: {args['model_preset']}, iteration {done}, "
               f"{args['global_batch_size']} x {args['seq_length']} tokens per step): {global_batch} x {seq_length} "
               f"tokens per step, iterations {first} to {last}, on {world} ranks, "
               + ("with stage 1's optimizer state and schedule" if load_optim else "with a fresh optimizer")
               + ", on " + (" ".join(data_path) if data_path else "stage 1's data (DATA_PATH or DATA_DIR for other)"))
    return Stage2Plan(world, flags, summary)
