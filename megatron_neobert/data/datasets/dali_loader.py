"""Optional NVIDIA DALI loader: the same batches as the torch loader, prefetched by a DALI pipeline.

Samples are read and collated in Python exactly as for the torch loader (same sampler, same
``collate_mlm_batch``); DALI's external source runs that callback ahead of the consumer
(``prefetch_queue_depth``, optionally in parallel worker processes) and, with a ``device_id``,
copies each batch to the GPU asynchronously. ``nvidia-dali`` is imported only when this loader is
chosen; the NGC container ships it, and ``nvidia-dali-cuda130`` from PyPI runs CPU-only pipelines.
"""

import logging
from typing import Callable, Dict, List, Optional

import numpy
import torch

from megatron_neobert.data.datasets.batches import MLMPretrainingSampler, collate_mlm_batch

logger = logging.getLogger(__name__)


def _output_names(sample: Dict) -> List[str]:
    names = ["tokens", "labels", "masked_positions", "num_masked"]
    if "cu_seqlens" in sample:
        names.append("cu_seqlens")
    if "attention_mask" in sample:
        names.append("attention_mask")
    if "dataset_id" in sample:
        names.append("dataset_id")
    return names


class _BatchSource:
    """DALI per-iteration callback: batch k of the sampler, as numpy arrays (picklable)."""

    def __init__(self, dataset, sampler: MLMPretrainingSampler, names: List[str], collate: Callable) -> None:
        self.dataset, self.sampler, self.names, self.collate = dataset, sampler, names, collate

    def __call__(self, sample_info):
        k = sample_info.idx_in_epoch
        if k >= len(self.sampler):
            raise StopIteration
        batch = self.collate([self.dataset[i] for i in self.sampler.batch_indices(k)])
        out = []
        for name in self.names:
            value = batch[name]
            if name == "num_masked":  # scalars travel as one-element arrays
                value = value.reshape(1).numpy()
            elif name == "attention_mask":
                value = value.numpy().astype(numpy.uint8)  # bool travels as uint8
            else:
                value = value.numpy()
            out.append(value)
        return tuple(out)


class DALIMLMLoader:
    """Iterable of collated batches like the torch loader's; tensors on ``cuda:device_id``, or on the CPU when
    ``device_id`` is None."""

    def __init__(self, dataset, sampler: MLMPretrainingSampler, device_id: Optional[int] = None,
                 num_workers: int = 0, prefetch_batches: int = 2, collate: Callable = collate_mlm_batch) -> None:
        try:
            from nvidia.dali import fn, pipeline_def
            from nvidia.dali.plugin.pytorch import DALIGenericIterator
        except ImportError as err:
            raise ImportError("loader='dali' needs NVIDIA DALI (pip install nvidia-dali-cuda130, "
                              "or the NGC container); the default loader='torch' does not") from err
        self.sampler = sampler
        self.names = _output_names(dataset[sampler.batch_indices(0)[0]])
        source = _BatchSource(dataset, sampler, self.names, collate)
        parallel = num_workers > 0

        @pipeline_def(batch_size=1, num_threads=1, device_id=device_id,
                      prefetch_queue_depth=max(1, prefetch_batches),
                      py_num_workers=max(1, num_workers),
                      # forking a process that holds a CUDA context is unsafe
                      py_start_method="spawn" if device_id is not None else "fork")
        def pipeline():
            outputs = fn.external_source(source=source, num_outputs=len(self.names),
                                         batch=False, parallel=parallel)
            if device_id is None:
                return tuple(outputs)
            return tuple(o.gpu() for o in outputs)

        self._pipe = pipeline()
        self._pipe.build()
        self._iterator = DALIGenericIterator(self._pipe, self.names)
        self._started = False
        logger.info("data loader: DALI pipeline on %s, %d python workers, prefetch %d batches",
                    "cpu" if device_id is None else f"cuda:{device_id}", num_workers,
                    prefetch_batches)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        if self._started:
            self._iterator.reset()
        self._started = True
        for outputs in self._iterator:
            data = outputs[0]
            batch = {}
            for name in self.names:
                value = data[name][0]  # drop DALI's batch dimension (one batch per iteration)
                if name == "attention_mask":
                    value = value.to(torch.bool)
                elif name == "num_masked":
                    value = value.reshape(())
                batch[name] = value
            yield batch
