"""What makes a batch, for the torch and DALI loaders alike: the collation (with the masked-position list) and the
resumable data-parallel sampler."""

import math
from typing import Dict, Iterator, List, Optional

import numpy
import torch

from megatron_neobert.data.datasets.mlm_dataset import IGNORE_INDEX


# Positions of the masked-position list are padded to a multiple of this.
MASKED_LIST_MULTIPLE = 64


def masked_list_capacity(num_tokens: int, mask_rate: float) -> int:
    """Length of the masked-position list of a batch of `num_tokens` tokens masked at `mask_rate`:
    fixed for a run (the head's shapes do not change between steps), above the binomial mean by six
    standard deviations (a batch beyond it about once in 10^9 gets a longer list, never a cut one)."""
    mean = num_tokens * mask_rate
    bound = math.ceil(mean + 6 * math.sqrt(mean * (1 - mask_rate)))
    return min(num_tokens, -(-bound // MASKED_LIST_MULTIPLE) * MASKED_LIST_MULTIPLE)


def masked_position_list(labels: torch.Tensor, mask_rate: Optional[float] = None):
    """(`masked_positions` int64 ``[P]``, `num_masked` int32 0-d): the indices of the labelled
    tokens in the flattened ``labels`` in order, then zeros up to ``masked_list_capacity`` (no
    padding without ``mask_rate``)."""
    found = (labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)
    count = found.shape[0]
    capacity = count
    if mask_rate is not None:
        capacity = max(masked_list_capacity(labels.numel(), mask_rate),
                       -(-count // MASKED_LIST_MULTIPLE) * MASKED_LIST_MULTIPLE)
    positions = torch.zeros(capacity, dtype=torch.int64, device=labels.device)
    positions[:count] = found
    return positions, torch.tensor(count, dtype=torch.int32)


def collate_mlm_batch(samples: List[Dict], mask_rate: Optional[float] = None) -> Dict:
    """Stack MLM samples into a batch.

    ``tokens``/``labels`` (and ``attention_mask``) become ``[B, S]``. Packed samples' cu_seqlens
    are offset by ``i * S`` and joined into one int32 ``cu_seqlens`` over the flattened ``B*S``
    tokens (the model reads packed batches as ``[1, B*S]``).
    ``masked_positions``/``num_masked``: see ``masked_position_list`` (a list of one length for
    every batch of a run when the dataset's ``mask_rate`` is given).
    A blend's ``dataset_id`` becomes an int64 ``[B]`` tensor.
    """
    batch = {"tokens": torch.stack([s["tokens"] for s in samples]),
             "labels": torch.stack([s["labels"] for s in samples])}
    batch["masked_positions"], batch["num_masked"] = masked_position_list(batch["labels"], mask_rate)
    if "attention_mask" in samples[0]:
        batch["attention_mask"] = torch.stack([s["attention_mask"] for s in samples])
    if "cu_seqlens" in samples[0]:
        seq = batch["tokens"].shape[1]
        parts = [s["cu_seqlens"][:-1] + i * seq for i, s in enumerate(samples)]
        parts.append(torch.tensor([len(samples) * seq], dtype=torch.int32))
        cu = torch.cat(parts).to(torch.int32)
        batch["cu_seqlens"] = cu
    if "dataset_id" in samples[0]:
        batch["dataset_id"] = torch.as_tensor(numpy.array([int(s["dataset_id"]) for s in samples]),
                                              dtype=torch.int64)
    return batch


class MLMPretrainingSampler:
    """Megatron-LM's ``MegatronPretrainingSampler``: a single ordered pass, resumable.

    Global batch k covers samples ``[consumed + k*M*D, consumed + (k+1)*M*D)`` (M micro batch,
    D data-parallel size); rank r takes the r-th slice of M. Randomness lives in the dataset
    (shuffled layouts), so the order is a pure function of the dataset and ``consumed_samples``.
    """

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 data_parallel_rank: int = 0, data_parallel_size: int = 1,
                 drop_last: bool = True) -> None:
        if total_samples <= 0:
            raise ValueError(f"no sample to load: total_samples = {total_samples}")
        if consumed_samples >= total_samples:
            raise ValueError(f"consumed_samples {consumed_samples} >= dataset size "
                             f"{total_samples}: build the dataset with more samples")
        if micro_batch_size <= 0 or not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"bad micro_batch_size {micro_batch_size} or data-parallel rank "
                             f"{data_parallel_rank} of {data_parallel_size}")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.drop_last = drop_last
        self._global = micro_batch_size * data_parallel_size

    def __len__(self) -> int:
        left = self.total_samples - self.consumed_samples
        if self.drop_last:
            return left // self._global
        return (left + self._global - 1) // self._global

    def batch_indices(self, k: int) -> List[int]:
        """This rank's sample indices in the k-th global batch from ``consumed_samples``."""
        start = self.consumed_samples + k * self._global + self.data_parallel_rank * self.micro_batch_size
        return list(range(start, min(start + self.micro_batch_size, self.total_samples)))

    def __iter__(self) -> Iterator[List[int]]:
        for k in range(len(self)):
            indices = self.batch_indices(k)
            if indices:
                yield indices
