"""Functions run on several gloo ranks by the tests (module level, so spawned ranks import them)."""

import dataclasses
import os

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.distributed.param_and_grad_buffer import shard_buffer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import unwrap_model

from megatron_neobert.model import NeoBERTArch, padded_vocab_size, transformer_config
from megatron_neobert.parallel.launch import initialize_model_parallel
from megatron_neobert.checkpoint.state import load_model_state, model_sharded_state_dict
from megatron_neobert.model.chunks import build_model_chunks
from megatron_neobert.training.engine.forward_step import micro_batch_tensor_shape, mlm_forward_step

# Small enough for 4 ranks on 2 cores, big enough to split: 4 layers, 4 heads, vocab 256.
TEST_ARCH = NeoBERTArch(num_layers=4, hidden_size=32, num_attention_heads=4, ffn_hidden_size=48,
                        vocab_size=256, max_sequence_length=64)


@dataclasses.dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    vpp: int = None
    dp: int = 1
    distributed_optimizer: bool = False
    sequence_parallel: bool = False

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


def setup(layout: Layout, arch: NeoBERTArch = TEST_ARCH, ddp: bool = True):
    initialize_model_parallel(layout.tp, layout.pp, layout.vpp, seed=1)
    config = transformer_config(arch, tensor_model_parallel_size=layout.tp,
                                pipeline_model_parallel_size=layout.pp,
                                virtual_pipeline_model_parallel_size=layout.vpp,
                                sequence_parallel=layout.sequence_parallel,
                                pipeline_dtype=torch.float32)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=layout.distributed_optimizer,
                                               grad_reduce_in_fp32=True) if ddp else None
    return config, build_model_chunks(arch, config, "local", padded_vocab_size(arch.vocab_size, layout.tp),
                                      ddp_config)


def save_initial_weights(ckpt_dir: str, arch: NeoBERTArch = TEST_ARCH):
    """A TP=1/PP=1 model's random weights, as a distributed checkpoint."""
    _, chunks = setup(Layout(), arch, ddp=False)
    os.makedirs(ckpt_dir, exist_ok=True)
    dist_checkpointing.save(model_sharded_state_dict(chunks), ckpt_dir)


def read_full_state_dict(ckpt_dir: str, arch: NeoBERTArch = TEST_ARCH):
    """Load a distributed checkpoint of any layout into a TP=1/PP=1 model: its full state dict."""
    _, chunks = setup(Layout(), arch, ddp=False)
    state = dist_checkpointing.load(model_sharded_state_dict(chunks), ckpt_dir)
    load_model_state(chunks, state)
    return {k: v.clone() for k, v in unwrap_model(chunks[0]).state_dict().items() if "_extra_state" not in k}


def _gather_reduce_scattered_grads(chunk) -> None:
    """With the distributed optimizer each DP rank holds only its shard of a bucket's reduced gradient: gather
    the shards so that every rank holds the whole reduced gradient."""
    for group in chunk.bucket_groups + chunk.expert_parallel_bucket_groups:
        if not group.ddp_config.use_distributed_optimizer:
            continue
        for bucket in group.buckets:
            shards = shard_buffer(bucket.grad_data, group.intra_distributed_optimizer_instance_size)
            mine = shards[group.intra_distributed_optimizer_instance_rank].clone()
            torch.distributed.all_gather(shards, mine, group=group.intra_distributed_optimizer_instance_group)


def gradients(layout: Layout, ckpt_in: str, ckpt_out: str, batches, micro_batch_size: int):
    """Load weights, run forward/backward over the global batch through megatron-core's schedule (which
    finishes the DP, TP and embedding gradient reductions), then save the gradients themselves: each
    parameter's data is replaced by its reduced gradient and the model saved as a distributed checkpoint,
    which `read_full_state_dict` reads back at TP=1/PP=1. Returns the global mean MLM loss (on last-stage
    ranks)."""
    config, chunks = setup(layout)
    state = dist_checkpointing.load(model_sharded_state_dict(chunks), ckpt_in)
    load_model_state(chunks, state)

    dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
    per_rank = len(batches) // dp_size
    mine = batches[dp_rank * per_rank:(dp_rank + 1) * per_rank]
    seq_length, mbs = micro_batch_tensor_shape(mine[0])
    iterators = [iter(mine) for _ in chunks]
    for chunk in chunks:
        chunk.zero_grad_buffer()
    reports = get_forward_backward_func()(
        forward_step_func=mlm_forward_step, data_iterator=iterators if len(chunks) > 1 else iterators[0],
        model=chunks, num_microbatches=len(mine), seq_length=seq_length, micro_batch_size=mbs,
        forward_only=False)
    with torch.no_grad():
        for chunk in chunks:
            _gather_reduce_scattered_grads(chunk)
            for param in chunk.parameters():
                param.copy_(param.main_grad)
    if torch.distributed.get_rank() == 0:
        os.makedirs(ckpt_out, exist_ok=True)
    torch.distributed.barrier()
    dist_checkpointing.save(model_sharded_state_dict(chunks), ckpt_out)

    if not parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return None
    total = torch.stack([r["lm loss"] for r in reports]).sum(0)
    torch.distributed.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return (total[0] / total[2]).item()
