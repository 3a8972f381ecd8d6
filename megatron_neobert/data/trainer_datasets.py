"""The trainer's datasets from its arguments, shared by the trainer and tools/build_data_cache.py
(which builds the layout caches ahead of training, so rank 0 never builds them under the process
group's timeout)."""

from megatron_neobert.data.blend import blends_from_args, parse_data_path
from megatron_neobert.data.mlm_dataset import MLMDatasetConfig, build_mlm_datasets


def num_samples(args):
    """Samples per split the trainer reads: train, every evaluation's, none for test."""
    num_evals = args.train_iters // args.eval_interval + 1 if args.eval_interval else 0
    return [args.train_iters * args.global_batch_size,
            num_evals * args.eval_iters * args.global_batch_size, 0]


def data_sources(args) -> dict:
    """MLMDatasetConfig's blend, blend_per_split and split from whichever data flag was given."""
    if args.mock_data:  # megatron-core's mock mode: no blend at all (MLMDataset's synthetic documents)
        return dict(blend=None, blend_per_split=None, split=None)
    per_split = [args.train_data_path, args.valid_data_path, args.test_data_path]
    if any(per_split):  # one blend per split, as Megatron-LM's --train/valid/test-data-path
        return dict(blend=None, blend_per_split=[parse_data_path(p) if p else None for p in per_split],
                    split=None)
    blend, blend_per_split = blends_from_args(args.data_path, args.data_args_path,
                                              args.per_split_data_args_path)
    return dict(blend=blend, blend_per_split=blend_per_split, split=None if blend_per_split else args.split)


def build_trainer_datasets(args, tokenizer, is_built_on_rank=None):
    """(train, valid, test) MLM datasets for the trainer's arguments (see build_mlm_datasets)."""
    config = MLMDatasetConfig(
        random_seed=args.seed, sequence_length=args.seq_length, **data_sources(args),
        path_to_cache=args.data_cache_path, tokenizer=tokenizer, mask_rate=args.mask_rate,
        mask_scheme=args.mask_scheme, packed=args.packed)
    return build_mlm_datasets(config, num_samples(args), is_built_on_rank)
