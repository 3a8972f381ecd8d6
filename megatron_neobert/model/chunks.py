"""This rank's model chunks for the parallel layout megatron-core's parallel state holds: one per virtual pipeline
stage, each this stage's part of the model, wrapped for training (Float16Module, DDP) when asked. Used by the trainer
and by the converters, which build the target layout's chunks to save from."""

from typing import List, Optional

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.finalize_model_grads import finalize_model_grads
from megatron.core.transformer.module import Float16Module

from megatron_neobert.model import NeoBERTArch, build_model


def build_model_chunks(arch: NeoBERTArch, config, transformer_impl: str, padded_vocab: int,
                       ddp_config: Optional[DistributedDataParallelConfig] = None) -> List[torch.nn.Module]:
    """This rank's NeoBERT model chunks: one per virtual pipeline stage (one without VPP).

    `padded_vocab`: rows of the embedding and output layer, the run's `ModelShape.padded_vocab_size` (a loaded
    checkpoint's own: its rows are fixed).

    With `ddp_config` each chunk is wrapped in megatron-core DDP (grad buffers, bucketed
    reduce(-scatter)) and `config` gets the hooks the pipeline schedules call (and, with Transformer
    Engine, `gradient_accumulation_fusion`).
    """
    if ddp_config is not None and transformer_impl == "transformer_engine":
        # TE's linears add their weight gradients straight into DDP's fp32 main_grad buffers.
        config.gradient_accumulation_fusion = True
    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
    chunks = []
    for vp_stage in range(vpp):
        vp = vp_stage if vpp > 1 else None
        chunk = build_model(
            arch, config, transformer_impl=transformer_impl, vocab_size=padded_vocab, vp_stage=vp,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp))
        if torch.cuda.is_available():
            chunk.cuda(torch.cuda.current_device())
        chunks.append(chunk)
    if config.fp16 or config.bf16:
        chunks = [Float16Module(config, c) for c in chunks]
    if ddp_config is None:
        return chunks
    chunks = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=c,
                                      disable_bucketing=i > 0)  # as Megatron-LM: bucket chunk 0 only
              for i, c in enumerate(chunks)]
    for chunk in chunks:
        chunk.broadcast_params()  # identical replicas across data-parallel ranks
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
    if ddp_config.overlap_grad_reduce:
        config.grad_sync_func = ([c.start_grad_sync for c in chunks] if len(chunks) > 1
                                 else chunks[0].start_grad_sync)
    return chunks
