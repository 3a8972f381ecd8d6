"""Rebuild the built-in sample corpus and tokenizer (megatron_neobert/assets/).

    apt-get install python3.11-doc      # or: apt-get download python3.11-doc && dpkg-deb -x ...
    python tools/make_sample_corpus.py --html-dir /usr/share/doc/python3.11/html

Documents are chosen by a hash of their URL (a stable pseudo-random subset, like a crawl
sample) until --max-chars characters; the WordPiece tokenizer is then trained on that subset.
"""

import hashlib
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir)))

from megatron_neobert.cli import ArgumentParser  # noqa: E402
from megatron_neobert.data.assets import SAMPLE_CORPUS, SAMPLE_TOKENIZER  # noqa: E402


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--html-dir", default="/usr/share/doc/python3.11/html",
                        help="Python's HTML documentation (Debian's python3.11-doc package)")
    parser.add_argument("--max-chars", type=int, default=6_000_000, help="stop adding documents past this many characters")
    parser.add_argument("--vocab-size", type=int, default=8192, help="WordPiece vocabulary size")
    parser.add_argument("--corpus", default=SAMPLE_CORPUS, help="the Parquet file to write (RefinedWeb's fields)")
    parser.add_argument("--tokenizer-dir", default=SAMPLE_TOKENIZER, help="the tokenizer folder to write")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    from megatron_neobert.data.sample_corpus import extract_documents, train_wordpiece, write_refinedweb_parquet

    if not os.path.isdir(args.html_dir):
        parser.error(f"{args.html_dir} not found: install Debian's python3.11-doc package")
    docs = sorted(extract_documents(args.html_dir),
                  key=lambda d: hashlib.md5(d["url"].encode()).hexdigest())
    chosen, chars = [], 0
    for doc in docs:
        if chars >= args.max_chars:
            break
        chosen.append(doc)
        chars += len(doc["content"])
    write_refinedweb_parquet(chosen, args.corpus)
    train_wordpiece([d["content"] for d in chosen], args.tokenizer_dir, args.vocab_size)
    print(f"{len(chosen)} documents, {chars / 1e6:.2f} M characters -> {args.corpus} "
          f"({os.path.getsize(args.corpus) / 1e6:.2f} MB); tokenizer -> {args.tokenizer_dir}")


if __name__ == "__main__":
    main()
