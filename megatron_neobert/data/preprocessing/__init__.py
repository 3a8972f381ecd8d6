"""Offline preprocessing, corpora to megatron-core's ``.bin/.idx``: the readers (Parquet, JSON lines, datasets), the
documents' sentences, the tokenizing workers and their shards (``preprocess``), the index writer, merging, length
subsets. Imports the data floor (tokenizer, indexed, records), never the training-time datasets."""
