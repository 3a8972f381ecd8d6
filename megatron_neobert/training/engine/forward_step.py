"""The MLM forward step and loss for megatron-core's pipeline schedules.

The loss is the cross-entropy summed over the masked tokens of a micro-batch, reported with
their count; with `calculate_per_token_loss` megatron-core divides the gradients once by the
count over the whole global batch (all micro-batches, all data-parallel ranks). The result is
the mean over *all* masked tokens of the global batch, whatever the micro-batch split.
"""

import dataclasses
from functools import partial
from typing import Callable, Dict, Iterator, List, Optional

import torch
from megatron.core import parallel_state
from megatron.core.optimizer.clip_grads import get_grad_norm_fp32
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared

from megatron_neobert.data.datasets.batches import masked_position_list
from megatron_neobert.model.neobert_model import packed_seq_params_from_cu_seqlens
from megatron_neobert.training.reporting.metrics import attended_pairs


def model_inputs(batch: Dict[str, torch.Tensor]) -> dict:
    """Keyword arguments of NeoBERTModel.forward for a collated batch (padded or packed).

    Nothing here waits for the GPU: the loader's batches are in pinned memory and copied
    asynchronously, the masked positions come as a list from the loader (found here, on the host,
    for a batch without them), and `max_seqlen` is the sample length (no document is longer), given
    rather than read from `cu_seqlens`, which would wait for the device.

    A fixed `max_seqlen` does not keep Transformer Engine's attention backend for packed input: TE 2.11
    caches the selection for the last call's `AttentionParams` alone, whose `batch_size` is the number of
    documents, and selects again (`get_attention_backend`) whenever they differ: in the first layer of
    nearly every packed micro-batch (padded input keeps its batch size and length). That costs host time
    only, no GPU work and no sync: Python checks and one cuDNN support query, estimated at well under a
    millisecond per micro-batch (not measured). The cuDNN graph itself is cached per bucket of the
    document count (up to 32, then powers of two up to 512) and of the token count (micro-batch x length,
    fixed), with cuDNN 9.6 and newer: a new one is built, once per run, when the count enters a new bucket."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    if "masked_positions" not in batch:
        batch = dict(batch)
        batch["masked_positions"], batch["num_masked"] = masked_position_list(batch["labels"])
    tokens, labels, positions, num_masked = (
        batch[k].to(device, non_blocking=True) for k in ("tokens", "labels", "masked_positions", "num_masked"))
    inputs = dict(masked_positions=positions, num_masked=num_masked)
    if "cu_seqlens" in batch:  # packed: all documents of the micro-batch end to end, [1, b*s]
        return dict(inputs, input_ids=tokens.reshape(1, -1), labels=labels.reshape(1, -1),
                    packed_seq_params=packed_seq_params_from_cu_seqlens(
                        batch["cu_seqlens"].to(device, non_blocking=True), tokens.shape[1]))
    mask = batch.get("attention_mask")
    return dict(inputs, input_ids=tokens, labels=labels,
                attention_mask=None if mask is None else mask.to(device, non_blocking=True))


def mlm_loss_func(num_masked: torch.Tensor, output):
    """(loss sum, masked-token count, report) of the model's per-position loss (0 on the padding of
    the masked-position list) and the count of real positions."""
    per_token_loss, correct = output
    loss_sum = per_token_loss.sum()
    report = torch.stack([loss_sum.detach(), correct.sum().float(), num_masked.float()])
    return loss_sum, num_masked, {"lm loss": report}


def mlm_forward_step(data_iterator: Iterator, model):
    """`forward_step_func` for `get_forward_backward_func()`: every stage reads the batch (it is
    deterministic and small), since middle stages need the mask or cu_seqlens too."""
    inputs = model_inputs(next(data_iterator))
    return model(**inputs), partial(mlm_loss_func, inputs["num_masked"])


def real_tokens(batch: Dict[str, torch.Tensor], pad_id: int) -> torch.Tensor:
    """Non-padding tokens of a micro-batch, as a 0-d tensor (no host sync): padded rows end in
    padding; packed rows may end in a padding piece."""
    if "attention_mask" in batch:
        return batch["attention_mask"].sum()
    return (batch["tokens"] != pad_id).sum()


def micro_batch_tensor_shape(batch: Dict[str, torch.Tensor]):
    """(seq_length, micro_batch_size) of the activations sent between pipeline stages."""
    b, s = batch["tokens"].shape
    return (b * s, 1) if "cu_seqlens" in batch else (s, b)


@dataclasses.dataclass
class StepStats:
    """Sums over the global batch of one step (or of an evaluation): the same on every rank."""

    loss_sum: float  # cross-entropy summed over the masked tokens
    correct: float  # masked tokens predicted right
    predicted: int  # masked tokens: what the loss and accuracy average over
    real_tokens: int = 0  # non-padding tokens (counted when the pad id is given)
    attended_pairs: int = 0  # query-key pairs attention computes: sum of squared document lengths

    @property
    def loss(self) -> float:
        return self.loss_sum / self.predicted if self.predicted else float("nan")

    @property
    def accuracy(self) -> float:
        return self.correct / self.predicted if self.predicted else float("nan")

    def __add__(self, other: "StepStats") -> "StepStats":
        return StepStats(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


STEP_STATS_FIELDS = tuple(f.name for f in dataclasses.fields(StepStats))  # the order of the summed vector

ForwardStep = Callable[[Iterator, torch.nn.Module], tuple]


def run_micro_batches(chunks, batches: List[dict], forward_only: bool, forward_step: ForwardStep = mlm_forward_step,
                      pad_id: Optional[int] = None) -> StepStats:
    """megatron-core's schedule over this rank's micro-batches of one global batch (forward and
    backward, or forward only); returns the global sums, on every rank."""
    seq_length, mbs = micro_batch_tensor_shape(batches[0])
    iterators = [iter(batches) for _ in chunks]  # every virtual stage reads the same micro-batches
    reports = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iterators if len(chunks) > 1 else iterators[0],
        model=chunks, num_microbatches=len(batches), seq_length=seq_length, micro_batch_size=mbs,
        forward_only=forward_only)
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    sums = torch.zeros(len(STEP_STATS_FIELDS), dtype=torch.float64, device=device)  # the StepStats fields
    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        for r in reports:  # (loss_sum, correct, predicted), as the loss function reports them
            sums[:STEP_STATS_FIELDS.index("real_tokens")] += r["lm loss"].to(sums)
        if pad_id is not None:  # counted on the host batches: the copy must not wait for the GPU
            sums[STEP_STATS_FIELDS.index("real_tokens")] = sum(
                real_tokens(b, pad_id).to(sums, non_blocking=True) for b in batches)
            sums[STEP_STATS_FIELDS.index("attended_pairs")] = sum(
                attended_pairs(b, pad_id).to(sums, non_blocking=True) for b in batches)
        torch.distributed.all_reduce(sums, group=parallel_state.get_data_parallel_group())
    # Only the last stage holds losses: summing over the pipeline hands them to every rank.
    torch.distributed.all_reduce(sums, group=parallel_state.get_pipeline_model_parallel_group())
    loss_sum, correct, predicted, tokens, pairs = sums.tolist()
    return StepStats(loss_sum, correct, int(predicted), int(tokens), int(pairs))


def grads_are_finite(chunks) -> bool:
    """Whether every rank's gradient buffers are finite (a NaN anywhere reaches some rank's
    shard after the reduce(-scatter), so the local buffers plus an all-reduce decide)."""
    bad = any(not torch.isfinite(buf.grad_data).all() for c in chunks for buf in c.buffers)
    flag = torch.tensor([float(bad)], device=chunks[0].buffers[0].grad_data.device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return not flag.item()


def params_are_finite(chunks) -> bool:
    """Whether every rank's model parameters are finite (checked before a save: a checkpoint must never hold a NaN,
    however it got into the weights)."""
    bad = any(not torch.isfinite(p).all() for c in chunks for p in c.parameters())
    flag = torch.tensor([float(bad)], device=next(chunks[0].parameters()).device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return not flag.item()


def params_norm(chunks) -> float:
    """The L2 norm of the model's parameters, as Megatron-LM's --log-params-norm: each parameter counted once
    (not the tensor-parallel copies, not the shared ones twice), summed over the model-parallel ranks."""
    params = [p.detach().float() for c in chunks for p in c.parameters()
              if param_is_not_shared(p) and param_is_not_tensor_parallel_duplicate(p)]
    return get_grad_norm_fp32(params, 2, parallel_state.get_model_parallel_group())
