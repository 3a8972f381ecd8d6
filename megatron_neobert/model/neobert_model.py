"""NeoBERT as a megatron-core `LanguageModule`.

embedding -> TransformerBlock (pre-norm layers, final norm) -> MLM output layer (Linear with bias,
no transform, untied). megatron-core's `BertModel` does not fit: it forces a dense+GELU+norm LM
head and cannot take packed sequences.

Inputs, as the data loader gives them:
- padded: `input_ids [b, s]` and `attention_mask [b, s]` (True = real token); the outputs at padded
  positions are undefined (Transformer Engine's padding mask zeroes them; the local spec masks
  only keys and computes them);
- packed: `input_ids [1, t]` (documents laid end to end) and `packed_seq_params` (THD, with
  `cu_seqlens`); RoPE positions restart at each document and attention never crosses one.
With `labels [b, s]` (-100 where there is no target) the output layer and the vocab-parallel
cross-entropy run only on the labelled positions: those of `masked_positions` (a fixed-size list
from the loader, indices into the flattened `[b * s]` labels, its first `num_masked` real), picked
with `index_select` and no host sync; without it the model finds them itself (a host sync).
"""

import copy
from typing import Optional, Tuple

import torch
from megatron.core import tensor_parallel
from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.transformer_block import TransformerBlock, TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from megatron_neobert.megatron_core_compat import linear_wgrad_fusion_available
from megatron_neobert.model.attention import LocalPackedSeqParams

IGNORE_INDEX = -100


def packed_seq_params_from_cu_seqlens(cu_seqlens: Tensor, max_seqlen: int) -> PackedSeqParams:
    cu_seqlens = cu_seqlens.to(torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                           max_seqlen_q=int(max_seqlen), max_seqlen_kv=int(max_seqlen))


class NeoBERTModel(LanguageModule):
    """A bidirectional pre-norm encoder with an MLM output layer, for TP/PP/VPP/SP training.

    Built from its spec (`layer_specs.neobert_model_spec`): `submodules` is this stage's block, and
    `local_attention` says whether its core attention is this package's `BidirectionalAttention` (the local
    spec) rather than Transformer Engine's: ours takes padded input without a mask, and packed input as
    `LocalPackedSeqParams`, with RoPE by token position unless megatron-core's fused THD RoPE applies it; TE's,
    built for `AttnMaskType.padding`, asserts that a mask is given."""

    def __init__(self, config: TransformerConfig, submodules: TransformerBlockSubmodules, local_attention: bool,
                 vocab_size: int, max_sequence_length: int, pre_process: bool = True,
                 post_process: bool = True, position_embedding_type: str = "rope",
                 rotary_base: int = 10000, pg_collection=None, vp_stage: Optional[int] = None):
        super().__init__(config=config, pg_collection=pg_collection)
        self.model_type = ModelType.encoder_or_decoder
        self.vocab_size = vocab_size
        self.max_sequence_length = max_sequence_length
        self.pre_process = pre_process
        self.post_process = post_process
        self.position_embedding_type = position_embedding_type
        self.vp_stage = vp_stage
        self.share_embeddings_and_output_weights = False  # NeoBERT's decoder is untied

        if pre_process:
            self.embedding = LanguageModelEmbedding(
                config=config, vocab_size=vocab_size, max_sequence_length=max_sequence_length,
                position_embedding_type=position_embedding_type, tp_group=self.pg_collection.tp)
        if position_embedding_type == "rope":
            self.rotary_pos_emb = RotaryEmbedding(
                kv_channels=config.kv_channels, rotary_percent=1.0,
                rotary_interleaved=config.rotary_interleaved, rotary_base=rotary_base,
                use_cpu_initialization=config.use_cpu_initialization, cp_group=self.pg_collection.cp)

        self.decoder = TransformerBlock(config=config, spec=submodules,
                                        pre_process=pre_process, post_process=post_process,
                                        pg_collection=self.pg_collection, vp_stage=vp_stage)
        self.local_attention = local_attention
        self.rope_by_position = local_attention and not config.apply_rope_fusion
        if post_process:
            self.output_layer = tensor_parallel.ColumnParallelLinear(
                config.hidden_size, vocab_size, config=self._head_config(config), init_method=config.init_method,
                bias=True, skip_bias_add=False, gather_output=False, tp_group=self.pg_collection.tp)
        self.setup_embeddings_and_output_layer()

    @staticmethod
    def _head_config(config: TransformerConfig) -> TransformerConfig:
        """The output layer's config: it sees only the labelled positions, gathered out of the sequence-parallel
        layout in forward(), so it must not gather them again (no sequence parallelism: its input gradient is
        all-reduced across TP instead); TE's linears fuse the weight-gradient accumulation themselves, this
        megatron-core linear only with apex's extension."""
        head_config = copy.copy(config)
        head_config.sequence_parallel = False
        head_config.gradient_accumulation_fusion = (config.gradient_accumulation_fusion
                                                    and linear_wgrad_fusion_available())
        return head_config

    def set_input_tensor(self, input_tensor) -> None:
        if isinstance(input_tensor, list):
            assert len(input_tensor) == 1, "NeoBERT has one input tensor per stage"
            input_tensor = input_tensor[0]
        self.decoder.set_input_tensor(input_tensor)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, packed_seq_params: Optional[PackedSeqParams] = None,
                position_ids: Optional[Tensor] = None, return_hidden_states: bool = False,
                masked_positions: Optional[Tensor] = None, num_masked: Optional[Tensor] = None):
        """Returns hidden states on a non-last pipeline stage; on the last one the logits
        `[b, s, vocab/tp]` without labels, or `(per-token loss, per-token correct)` over the
        labelled positions (in `[b, s]` order; 0 and False on the padding of `masked_positions`)
        with them. `return_hidden_states` gives the final-normed encoder output `[b, s, h]`
        instead (embeddings for inference)."""
        if packed_seq_params is not None and attention_mask is not None:
            raise ValueError("give either an attention_mask (padded) or packed_seq_params, not both")
        if (masked_positions is None) != (num_masked is None):
            raise ValueError("give masked_positions and num_masked together")
        if self.position_embedding_type == "learned_absolute" and position_ids is None:
            position_ids = self._default_position_ids(input_ids, packed_seq_params)
        if attention_mask is None and packed_seq_params is None and not self.local_attention:
            attention_mask = torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)

        hidden = self.embedding(input_ids=input_ids, position_ids=position_ids) if self.pre_process else None
        rotary_pos_emb = None
        if self.position_embedding_type == "rope":
            seq_len = self.rotary_pos_emb.get_rotary_seq_len(None, self.decoder, hidden, self.config,
                                                             packed_seq_params)
            rotary_pos_emb = self.rotary_pos_emb(seq_len, packed_seq=packed_seq_params is not None)
        if packed_seq_params is not None and self.local_attention:
            rotary = {}
            if rotary_pos_emb is not None and self.rope_by_position:
                positions = self._default_position_ids(input_ids, packed_seq_params)[0]
                rotary = LocalPackedSeqParams.rotary_by_position(
                    rotary_pos_emb, positions, self.config.params_dtype, self.config.rotary_interleaved)
                rotary_pos_emb = None
            packed_seq_params = LocalPackedSeqParams.of(packed_seq_params, input_ids.shape[1], **rotary)
        # megatron-core masks are True where attention is *not* allowed: [b, 1, 1, s] over keys.
        mask = None if attention_mask is None else ~attention_mask.bool()[:, None, None, :]

        hidden = self.decoder(hidden_states=hidden, attention_mask=mask, rotary_pos_emb=rotary_pos_emb,
                              packed_seq_params=packed_seq_params)
        if not self.post_process:
            return hidden
        if self.config.sequence_parallel:
            # Back to the full sequence; each rank keeps its own slice's gradient on the way back.
            hidden = tensor_parallel.gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=False, group=self.pg_collection.tp)
        if return_hidden_states:
            return hidden.transpose(0, 1)
        if labels is None:
            logits, _ = self.output_layer(hidden)
            return logits.transpose(0, 1).contiguous()
        return self.masked_lm_loss(hidden, labels, masked_positions, num_masked)

    def masked_lm_loss(self, hidden: Tensor, labels: Tensor, masked_positions: Optional[Tensor] = None,
                       num_masked: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Output layer and cross-entropy on the labelled positions only."""
        flat_labels = labels.reshape(-1)
        if masked_positions is None:
            masked_positions = (flat_labels != IGNORE_INDEX).nonzero().squeeze(1)
            real = None
        else:
            real = torch.arange(masked_positions.shape[0], device=labels.device) < num_masked
        targets = flat_labels.index_select(0, masked_positions)
        # Position p of the [b, s] labels is row (p % s) * b + p // s of the [s, b] hidden states
        # (packed input is [1, t]: row p).
        b, s = labels.shape
        rows = (masked_positions % s) * b + masked_positions // s
        selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)
        if real is not None:  # the padding of the list reads position 0; its target is any valid id
            targets = torch.where(real, targets, 0)
        logits, _ = self.output_layer(selected.unsqueeze(1))  # [n, 1, vocab/tp]
        targets = targets.unsqueeze(1)
        with torch.no_grad():
            correct = self._vocab_parallel_argmax(logits.detach()) == targets
        if self.config.cross_entropy_loss_fusion and logits.dtype == torch.bfloat16:
            # megatron-core's fused kernel returns bf16 gradients: it applies to bf16 logits only.
            loss = fused_vocab_parallel_cross_entropy(logits, targets, self.pg_collection.tp)
        else:
            loss = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), targets)
        loss, correct = loss.squeeze(1), correct.squeeze(1)
        if real is not None:
            loss, correct = torch.where(real, loss, 0.0), correct & real
        return loss, correct

    def _vocab_parallel_argmax(self, logits: Tensor) -> Tensor:
        tp_group = self.pg_collection.tp
        local_max, local_idx = logits.max(dim=-1)
        if tp_group.size() == 1:
            return local_idx
        global_idx = local_idx + tp_group.rank() * logits.shape[-1]
        maxes = [torch.empty_like(local_max) for _ in range(tp_group.size())]
        idxs = [torch.empty_like(global_idx) for _ in range(tp_group.size())]
        torch.distributed.all_gather(maxes, local_max.contiguous(), group=tp_group)
        torch.distributed.all_gather(idxs, global_idx.contiguous(), group=tp_group)
        best = torch.stack(maxes).argmax(dim=0, keepdim=True)
        return torch.stack(idxs).gather(0, best).squeeze(0)

    @staticmethod
    def _default_position_ids(input_ids: Tensor, packed_seq_params: Optional[PackedSeqParams]) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if packed_seq_params is not None:  # restart at each document
            starts = packed_seq_params.cu_seqlens_q[:-1].to(positions.device).long()
            doc = torch.bucketize(positions, starts, right=True) - 1
            positions = positions - starts[doc]
        return positions.unsqueeze(0).expand_as(input_ids)
