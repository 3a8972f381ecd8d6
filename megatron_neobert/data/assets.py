"""Paths of the built-in sample corpus and tokenizer (see megatron_neobert/assets/README.md)."""

import os

ASSETS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")

#: RefinedWeb-schema Parquet file (content, url, timestamp, dump, segment, image_urls).
SAMPLE_CORPUS = os.path.join(ASSETS_DIR, "sample_corpus.parquet")

#: Hugging Face tokenizer folder: lowercase WordPiece, 8192 entries, BERT special tokens.
SAMPLE_TOKENIZER = os.path.join(ASSETS_DIR, "tokenizer")
