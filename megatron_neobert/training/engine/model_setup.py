"""The trainer's set-up: this rank's model chunks (pipeline stages, virtual stages) wrapped for
training, their optimizer and learning-rate schedule, from the run's settings."""

import random
from typing import Callable, Optional

import numpy
import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer.enums import AttnBackend

from megatron_neobert.model import ModelShape, resolve_model_shape, transformer_config
from megatron_neobert.model.chunks import build_model_chunks
from megatron_neobert.parallel.launch import initialize_model_parallel
from megatron_neobert.checkpoint.state import checkpoint_args
from megatron_neobert.training.config.schedule import schedule_steps
from megatron_neobert.training.config.settings import Settings


def run_model_shape(settings: Settings, tokenizer_vocab_size: Optional[int] = None,
                    common: Optional[dict] = None) -> ModelShape:
    """The run's model shape (`model.resolve_model_shape`) from its settings, its tokenizer's size and the common
    state of the checkpoint it loads (None: from scratch)."""
    model = settings.model
    return resolve_model_shape(
        model.model_preset, model.arch_overrides(), tokenizer_vocab_size=tokenizer_vocab_size,
        seq_length=settings.data.seq_length, tensor_model_parallel_size=settings.parallel.tensor_model_parallel_size,
        make_vocab_size_divisible_by=model.make_vocab_size_divisible_by,
        checkpoint_args=checkpoint_args(common) if common else None,
        use_checkpoint_args=settings.checkpoint.use_checkpoint_args)


def build_scheduler(training, optimizer):
    """megatron-core's `OptimizerParamScheduler` for `training` (the TrainingSettings): linear warmup from
    --lr-warmup-init, the --lr-decay-style to --min-lr, then --min-lr; step it by the samples of each iteration (its
    global batch), as Megatron-LM does."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    warmup, decay, wsd, span = schedule_steps(training)
    return OptimizerParamScheduler(
        optimizer, init_lr=training.lr_warmup_init, max_lr=training.lr, min_lr=training.min_lr,
        lr_warmup_steps=warmup, lr_decay_steps=decay,
        lr_decay_style=training.lr_decay_style, start_wd=training.weight_decay, end_wd=training.weight_decay,
        wd_incr_steps=span, wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=not training.override_opt_param_scheduler,
        override_opt_param_scheduler=training.override_opt_param_scheduler,
        wsd_decay_steps=wsd, lr_wsd_decay_style=training.lr_wsd_decay_style)


def set_random_seed(seed: int) -> None:
    """As Megatron-LM: one seed per pipeline stage (stages must not start with equal layers);
    the tensor-parallel RNG tracker adds the TP rank for the sharded weights and dropout."""
    seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def setup_model_and_optimizer(settings: Settings, shape: ModelShape, lap: Callable[[str], None] = lambda part: None):
    """(transformer config, model chunks, optimizer, scheduler) of this rank for the model's `shape`, after
    initialising megatron-core's parallel state for the layout the settings ask for. `lap(part)` is called as each
    part ends (the start-up's account)."""
    model, precision, parallel, training = settings.model, settings.precision, settings.parallel, settings.training
    arch = shape.arch
    vpp = None
    if parallel.num_layers_per_virtual_pipeline_stage:  # a split that divides: run_checks.check_parallel_shape
        vpp = arch.num_layers // (parallel.pipeline_model_parallel_size
                                  * parallel.num_layers_per_virtual_pipeline_stage)
    initialize_model_parallel(parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size, vpp,
                              seed=None, distributed_timeout_minutes=settings.faults.distributed_timeout_minutes)
    set_random_seed(training.seed)  # the run's one seeding, once the pipeline rank is known
    lap("model-parallel groups")
    dtype = torch.bfloat16 if precision.bf16 else torch.float16 if precision.fp16 else torch.float32
    optional = {}
    if model.recompute_granularity:
        optional = dict(recompute_granularity=model.recompute_granularity)
        if model.recompute_granularity == "full":
            optional.update(recompute_method=model.recompute_method,
                            recompute_num_layers=model.recompute_num_layers)
    if model.init_method_std is not None:  # megatron-core's normal init (its output layers scaled by depth)
        optional.update(init_method=None, output_layer_init_method=None, embedding_init_method=None,
                        init_method_std=model.init_method_std)
    config = transformer_config(
        arch, hidden_dropout=model.hidden_dropout, attention_dropout=model.attention_dropout,
        attention_backend=AttnBackend[model.attention_backend],
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=vpp, sequence_parallel=parallel.sequence_parallel,
        bf16=precision.bf16, fp16=precision.fp16, params_dtype=dtype, pipeline_dtype=dtype,
        fp8=precision.fp8_format, fp8_recipe=precision.fp8_recipe if precision.fp8_format else "delayed", **optional)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=parallel.overlap_grad_reduce,
        overlap_param_gather=parallel.overlap_param_gather, bucket_size=parallel.ddp_bucket_size,
        use_distributed_optimizer=parallel.use_distributed_optimizer)
    chunks = build_model_chunks(arch, config, model.transformer_impl, shape.padded_vocab_size, ddp_config)
    if parallel.overlap_param_gather:  # the schedules start each chunk's parameter all-gather
        config.param_sync_func = [c.start_param_sync for c in chunks]
        if len(chunks) == 1:
            config.param_sync_func = config.param_sync_func[0]
    lap("model")
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", decoupled_weight_decay=training.optimizer != "adam-l2", lr=training.lr,
        min_lr=training.min_lr, weight_decay=training.weight_decay, adam_beta1=training.adam_beta1,
        adam_beta2=training.adam_beta2, adam_eps=training.adam_eps, clip_grad=training.clip_grad,
        bf16=precision.bf16, fp16=precision.fp16, initial_loss_scale=precision.initial_loss_scale,
        loss_scale=precision.loss_scale, params_dtype=dtype,
        use_distributed_optimizer=parallel.use_distributed_optimizer,
        log_num_zeros_in_grad=settings.logging.log_num_zeros_in_grad), chunks)
    if precision.fp16:  # the schedules multiply the loss by the loss scale before the backward pass
        config.grad_scale_func = optimizer.scale_loss
    scheduler = build_scheduler(training, optimizer)
    lap("optimizer")
    return config, chunks, optimizer, scheduler


def finish_param_sync(chunks) -> None:
    """With --overlap-param-gather the distributed optimizer's all-gather of updated parameters
    happens in the next forward; force it before evaluating or saving (a no-op without it)."""
    for c in chunks:
        if c.ddp_config.overlap_param_gather:
            c.disable_forward_pre_hook(param_sync=True)


def resume_param_sync(chunks) -> None:
    for c in chunks:
        if c.ddp_config.overlap_param_gather:
            c.enable_forward_pre_hook()
