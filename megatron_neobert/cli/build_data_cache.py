"""Build the MLM datasets' caches ahead of training, in one process, with the training command's own
flags (same data, split, length, seed, --train-iters, --data-cache-path): each corpus's document
table (its index checked in full, the special tokens its documents carry) and the layouts. Rank 0
of the job then only loads them instead of building them under the process group's timeout:

    neobert-build-data-cache --data-path 0.6 data/rw_content_document 0.4 data/rw1024 \
        --data-cache-path data/cache --seq-length 1024 --train-iters 100000 --global-batch-size 2048
    torchrun ... -m megatron_neobert.pretrain <the same flags> ...

Prints the samples per split and where the cache is.
"""

import logging
import sys
import time

from megatron_neobert.training.arguments import parse_settings


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        settings = parse_settings(argv)  # --help answers here, before megatron-core is imported
        from megatron_neobert.data.tokenizer import build_tokenizer
        from megatron_neobert.data.trainer_datasets import build_trainer_datasets

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
