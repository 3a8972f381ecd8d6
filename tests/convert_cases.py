"""Functions test_convert runs on several gloo ranks (module level, so spawned ranks import them)."""

from typing import Dict, List, Optional

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

from megatron_neobert.megatron_core_compat import load_common_state
from megatron_neobert.model import NeoBERTArch, transformer_config
from megatron_neobert.model.neobert_model import packed_seq_params_from_cu_seqlens
from megatron_neobert.parallel.launch import initialize_model_parallel
from megatron_neobert.checkpoint.layout import resolve_checkpoint_dir
from megatron_neobert.checkpoint.state import checkpoint_args, load_model_state, model_sharded_state_dict
from megatron_neobert.model.chunks import build_model_chunks
from megatron_neobert.training.engine.forward_step import micro_batch_tensor_shape
from parallel_cases import Layout

Batch = Dict[str, torch.Tensor]


def pipeline_logits(chunks: List[torch.nn.Module], micro_batches: List[Batch]) -> Optional[torch.Tensor]:
    """Full-vocabulary MLM logits [n, s, padded vocab] (packed micro-batches: [n, b * s, padded vocab])
    through megatron-core's forward-only pipeline schedule; None on ranks that are not on the last
    pipeline stage."""

    def collect(logits, non_loss_data=False):  # called with non_loss_data=True in forward-only mode
        assert non_loss_data
        return gather_from_tensor_model_parallel_region(logits).detach().clone()

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        if "cu_seqlens" in batch:  # packed, as the trainer's step gives it
            params = packed_seq_params_from_cu_seqlens(batch["cu_seqlens"], batch["tokens"].shape[1])
            return model(input_ids=batch["tokens"].reshape(1, -1), packed_seq_params=params), collect
        return model(input_ids=batch["tokens"], attention_mask=batch["attention_mask"]), collect

    for chunk in chunks:
        chunk.eval()
    seq_length, mbs = micro_batch_tensor_shape(micro_batches[0])
    iterators = [iter(micro_batches) for _ in chunks]
    with torch.no_grad():
        out = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iterators if len(chunks) > 1 else iterators[0],
            model=chunks, num_microbatches=len(micro_batches), seq_length=seq_length, micro_batch_size=mbs,
            forward_only=True, collect_non_loss_data=True)
    if not parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return None
    return torch.cat(out, dim=0)


def load_and_forward(ckpt: str, layout: Layout, micro_batches: List[Batch]) -> Optional[torch.Tensor]:
    """Load a converted checkpoint at `layout` from its args alone, as the trainer would; MLM logits."""
    ckpt_dir = resolve_checkpoint_dir(ckpt)
    args = checkpoint_args(load_common_state(ckpt_dir))
    arch = NeoBERTArch(**args["arch"])
    initialize_model_parallel(layout.tp, layout.pp, layout.vpp, seed=1)
    config = transformer_config(arch, tensor_model_parallel_size=layout.tp,
                                pipeline_model_parallel_size=layout.pp,
                                virtual_pipeline_model_parallel_size=layout.vpp, pipeline_dtype=torch.float32)
    chunks = build_model_chunks(arch, config, "local", padded_vocab=args["padded_vocab_size"])
    load_model_state(chunks, dist_checkpointing.load(model_sharded_state_dict(chunks), ckpt_dir))
    return pipeline_logits(chunks, micro_batches)
