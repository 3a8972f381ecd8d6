"""Data for NeoBERT pre-training on megatron-core, in two rooms over a floor they share.

The floor (this folder): ``tokenizer.build_tokenizer`` (Hugging Face or SentencePiece tokenizers with BERT special
ids), ``indexed`` (checks and safe writing of megatron-core's ``.bin/.idx``), ``records`` (the tokenizer record
beside a dataset), ``assets`` (``SAMPLE_CORPUS`` and ``SAMPLE_TOKENIZER``, the built-in offline corpus/tokenizer).

- ``preprocessing/``: offline, corpora to ``.bin/.idx``: ``preprocess.preprocess_data`` (RefinedWeb Parquet / JSON
  lines / datasets, ``neobert-preprocess-data``), its readers, documents' sentences, the index writer, merging
  (``neobert-merge-datasets``), length subsets (``length_subset.make_length_subset``, RefinedWeb1024+ style,
  ``neobert-make-length-subset``).
- ``datasets/``: at training time, ``.bin/.idx`` to batches: ``mlm_dataset`` (``MLMDatasetConfig``,
  ``MLMDataset``, ``build_mlm_datasets``: packed or padded MLM samples through ``BlendedMegatronDatasetBuilder``),
  the layout (``packing``), the corpus's document table (``documents``), blends (``blend.parse_data_path``), the
  trainer's datasets from its settings, the batches (``batches``: collation, the resumable sampler) and the loaders
  (``loader.build_data_loader``: torch, or DALI via ``dali_loader``).

Each room imports from the floor, never from the other. Submodules are imported on use: megatron-core and
transformers are slow to import.
"""
