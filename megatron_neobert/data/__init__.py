"""Data for NeoBERT pre-training on megatron-core.

- ``tokenizer.build_tokenizer``: Hugging Face or SentencePiece tokenizers with BERT special ids.
- ``preprocess.preprocess_data``: RefinedWeb Parquet / JSON lines / datasets -> ``.bin/.idx``
  (``neobert-preprocess-data``); ``length_subset.make_length_subset``: RefinedWeb1024+ style
  subsets (``neobert-make-length-subset``).
- ``mlm_dataset``: ``MLMDatasetConfig``, ``MLMDataset``, ``build_mlm_datasets`` (packed or padded
  MLM samples through ``BlendedMegatronDatasetBuilder``); ``blend.parse_data_path``.
- ``loader``: ``collate_mlm_batch``, ``MLMPretrainingSampler``, ``build_data_loader`` (torch, or
  DALI via ``dali_loader``).
- ``assets``: ``SAMPLE_CORPUS`` and ``SAMPLE_TOKENIZER``, the built-in offline corpus/tokenizer.

Submodules are imported on use: megatron-core and transformers are slow to import.
"""
