"""The trainer's data: the tokenizer, and this data-parallel rank's training and validation
micro-batch iterators, resumed at a number of consumed samples."""

import torch
from megatron.core import parallel_state

from megatron_neobert.data.datasets.loader import build_data_loader
from megatron_neobert.data.datasets.trainer_datasets import build_trainer_datasets
from megatron_neobert.data.tokenizer import build_tokenizer
from megatron_neobert.training.resilience.guards.children import data_worker_init


def build_data(settings, consumed_train: int, consumed_valid: int, tokenizer=None, worker_init=data_worker_init):
    """(tokenizer, training iterator, validation iterator or None); `tokenizer`: the one already
    built for the run, else built here; `worker_init`: the DataLoader workers' (the run's guards name a bus error in
    them too)."""
    data, evaluation = settings.data, settings.evaluation
    tokenizer = tokenizer or build_tokenizer(data.tokenizer_type, data.tokenizer_model)
    train_ds, valid_ds, _ = build_trainer_datasets(settings, tokenizer)
    dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
    device_id = torch.cuda.current_device() if torch.cuda.is_available() else None

    def loader(dataset, consumed):
        return build_data_loader(dataset, settings.training.micro_batch_size, consumed, dp_rank, dp_size,
                                 num_workers=data.num_workers, loader=data.data_loader, device_id=device_id,
                                 worker_init_fn=worker_init)

    valid = None
    if valid_ds is not None and evaluation.eval_interval and evaluation.eval_iters:
        valid = iter(loader(valid_ds, consumed_valid))
    return tokenizer, iter(loader(train_ds, consumed_train)), valid
