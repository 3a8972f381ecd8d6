r"""Build the MLM datasets' caches ahead of training, in one process, with the training command's own
flags (same data, split, length, seed, --train-iters, --data-cache-path): each corpus's document
table (its index checked in full, the special tokens its documents carry) and the layouts. Rank 0
of the job then only loads them instead of building them under the process group's timeout:

    neobert-build-data-cache --data-path 0.6 data/rw_content_document 0.4 data/rw1024 \
        --data-cache-path data/cache --seq-length 1024 --train-iters 100000 --global-batch-size 2048
    torchrun ... -m megatron_neobert.pretrain <the same flags> ...

Prints the samples per split and where the cache is.
"""

import dataclasses
import sys
import time

from megatron_neobert.cli import console_logging, megatron_runtime
from megatron_neobert.training.config.arguments import build_parser, parse_settings
from megatron_neobert.training.config.settings import DataSettings

# The settings the datasets depend on: the data flags, and the lengths of the training and its evaluations.
READS = {f.name for f in dataclasses.fields(DataSettings)} - {"data_loader", "num_workers"} | {
    "seed", "train_iters", "train_samples", "global_batch_size", "eval_interval", "eval_iters"}


@console_logging("%(levelname)s %(message)s")
def main(argv=None) -> int:
    parser = build_parser("neobert-build-data-cache", __doc__, shown=READS,
                          epilog="The training command's other flags are accepted and change nothing here "
                                 "(neobert-pretrain --help lists them).")
    try:
        settings = parse_settings(argv, parser=parser)  # --help answers here, before megatron-core is imported
        with megatron_runtime():
            from megatron_neobert.data.datasets.trainer_datasets import build_trainer_datasets
            from megatron_neobert.data.tokenizer import build_tokenizer

            tokenizer = build_tokenizer(settings.data.tokenizer_type, settings.data.tokenizer_model)
            start = time.perf_counter()
            datasets = build_trainer_datasets(settings, tokenizer)
    except ValueError as err:  # bad flags, data or tokenizer
        print(f"error: {err}", file=sys.stderr)
        return 1
    sizes = ", ".join(f"{name} {len(ds):,}" for name, ds in zip(("train", "valid", "test"), datasets)
                      if ds is not None)
    print(f"built in {time.perf_counter() - start:.1f} s: {sizes} samples; cache in "
          f"{settings.data.data_cache_path or 'cache/ beside each dataset'}")
    return 0
