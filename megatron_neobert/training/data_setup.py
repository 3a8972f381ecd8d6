"""The trainer's data: the tokenizer, and this data-parallel rank's training and validation
micro-batch iterators, resumed at a number of consumed samples."""

import torch
from megatron.core import parallel_state

from megatron_neobert.data.blend import parse_data_path
from megatron_neobert.data.loader import build_data_loader
from megatron_neobert.data.mlm_dataset import MLMDatasetConfig, build_mlm_datasets
from megatron_neobert.data.tokenizer import build_tokenizer


def num_evaluations(args) -> int:
    return args.train_iters // args.eval_interval + 1 if args.eval_interval else 0


def build_data(args, consumed_train: int, consumed_valid: int):
    """(tokenizer, training iterator, validation iterator or None)."""
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model)
    per_split = [args.train_data_path, args.valid_data_path, args.test_data_path]
    sources = dict(blend=parse_data_path(args.data_path), split=args.split)
    if any(per_split):  # one blend per split, as Megatron-LM's --train/valid/test-data-path
        sources = dict(blend_per_split=[parse_data_path(p) if p else None for p in per_split])
    elif args.mock_data:  # no blend at all: megatron-core's mock mode (MLMDataset's synthetic documents)
        sources = dict(blend=None, split=None)
    config = MLMDatasetConfig(
        random_seed=args.seed, sequence_length=args.seq_length, **sources,
        path_to_cache=args.data_cache_path, tokenizer=tokenizer,
        mask_rate=args.mask_rate, mask_scheme=args.mask_scheme, packed=args.packed)
    num_evals = num_evaluations(args)
    train_ds, valid_ds, _ = build_mlm_datasets(
        config, [args.train_iters * args.global_batch_size,
                 num_evals * args.eval_iters * args.global_batch_size, 0])
    dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
    device_id = torch.cuda.current_device() if torch.cuda.is_available() else None

    def loader(dataset, consumed):
        return build_data_loader(dataset, args.micro_batch_size, consumed, dp_rank, dp_size,
                                 num_workers=args.num_workers, loader=args.data_loader, device_id=device_id)

    valid = None
    if valid_ds is not None and num_evals and args.eval_iters:
        valid = iter(loader(valid_ds, consumed_valid))
    return tokenizer, iter(loader(train_ds, consumed_train)), valid
