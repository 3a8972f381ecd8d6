"""The trainer's datasets from its settings, shared by the trainer and tools/build_data_cache.py
(which builds the layout caches ahead of training, so rank 0 never builds them under the process
group's timeout)."""

from megatron_neobert.data.datasets.blend import blends_from_args, parse_data_path
from megatron_neobert.data.datasets.mlm_dataset import MLMDatasetConfig, build_mlm_datasets


def num_samples(settings):
    """Samples per split the trainer reads: train, every evaluation's, none for test."""
    training, evaluation = settings.training, settings.evaluation
    num_evals = training.train_iters // evaluation.eval_interval + 1 if evaluation.eval_interval else 0
    return [training.train_iters * training.global_batch_size,
            num_evals * evaluation.eval_iters * training.global_batch_size, 0]


def data_sources(data) -> dict:
    """MLMDatasetConfig's blend, blend_per_split and split from whichever data flag was given."""
    if data.mock_data:  # megatron-core's mock mode: no blend at all (MLMDataset's synthetic documents)
        return dict(blend=None, blend_per_split=None, split=None)
    per_split = [data.train_data_path, data.valid_data_path, data.test_data_path]
    if any(per_split):  # one blend per split, as Megatron-LM's --train/valid/test-data-path
        return dict(blend=None, blend_per_split=[parse_data_path(p) if p else None for p in per_split],
                    split=None)
    blend, blend_per_split = blends_from_args(data.data_path, data.data_args_path,
                                              data.per_split_data_args_path)
    return dict(blend=blend, blend_per_split=blend_per_split, split=None if blend_per_split else data.split)


def build_trainer_datasets(settings, tokenizer, is_built_on_rank=None):
    """(train, valid, test) MLM datasets for the trainer's settings (see build_mlm_datasets)."""
    data = settings.data
    config = MLMDatasetConfig(
        random_seed=settings.training.seed, sequence_length=data.seq_length, **data_sources(data),
        path_to_cache=data.data_cache_path, tokenizer=tokenizer, mask_rate=data.mask_rate,
        mask_scheme=data.mask_scheme, packed=data.packed)
    return build_mlm_datasets(config, num_samples(settings), is_built_on_rank)
