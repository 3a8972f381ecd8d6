"""The trainer's loaders: torch's DataLoader or DALI's pipeline over the same sampler and collation (batches.py)."""

import functools
import logging

import torch

from megatron_neobert.data.datasets.batches import MLMPretrainingSampler, collate_mlm_batch
from megatron_neobert.data.datasets.dali_loader import DALIMLMLoader

logger = logging.getLogger(__name__)


def build_data_loader(dataset, micro_batch_size: int, consumed_samples: int = 0,
                      data_parallel_rank: int = 0, data_parallel_size: int = 1,
                      num_workers: int = 2, loader: str = "torch", drop_last: bool = True,
                      pin_memory: bool = True, device_id=None, prefetch_batches: int = 2,
                      worker_init_fn=None):
    """An iterable of collated batches (see ``collate_mlm_batch``) for one data-parallel rank.

    Args:
        dataset: an ``MLMDataset`` or megatron-core ``BlendedDataset`` of them (or None: returns
            None, as on ranks that do not build data).
        micro_batch_size: samples per batch on this rank.
        consumed_samples: global samples already trained on (from the checkpoint); the loader
            starts right after them, so a resumed run sees the batches it would have seen.
        data_parallel_rank, data_parallel_size: the rank's slice of each global batch.
        num_workers: torch DataLoader workers, or DALI's parallel Python workers (0 = inline).
        loader: "torch" (default) or "dali" (batches prefetched by a DALI pipeline; on the GPU
            ``device_id`` unless None, which keeps DALI on the CPU).
        drop_last: drop a final incomplete global batch.
        pin_memory: pin host batches (torch loader, when CUDA is available).
        prefetch_batches: batches prepared ahead (torch prefetch_factor per worker / DALI queue).
        worker_init_fn: run first in each torch DataLoader worker (the trainer's makes workers
            ignore pre-emption signals and die with their rank).
    """
    if dataset is None:
        return None
    sampler = MLMPretrainingSampler(len(dataset), consumed_samples, micro_batch_size,
                                    data_parallel_rank, data_parallel_size, drop_last)
    collate = functools.partial(collate_mlm_batch, mask_rate=dataset.config.mask_rate)
    if loader == "torch":
        logger.info("data loader: torch DataLoader, %d workers, from sample %d",
                    num_workers, consumed_samples)
        return torch.utils.data.DataLoader(
            dataset, batch_sampler=sampler, num_workers=num_workers,
            collate_fn=collate, pin_memory=pin_memory and torch.cuda.is_available(),
            persistent_workers=num_workers > 0, worker_init_fn=worker_init_fn,
            prefetch_factor=prefetch_batches if num_workers > 0 else None)
    if loader == "dali":
        return DALIMLMLoader(dataset, sampler, device_id=device_id, num_workers=num_workers,
                             prefetch_batches=prefetch_batches, collate=collate)
    raise ValueError(f"unknown loader {loader!r}; expected 'torch' or 'dali'")
