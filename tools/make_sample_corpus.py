"""Rebuild the built-in sample corpus (RefinedWeb's Parquet schema) and its WordPiece tokenizer
(megatron_neobert/assets/).

    apt-get install python3.11-doc      # or: apt-get download python3.11-doc && dpkg-deb -x ...
    python tools/make_sample_corpus.py --html-dir /usr/share/doc/python3.11/html

The text is the Python 3.11 documentation as Debian ships it (package python3.11-doc, HTML under
/usr/share/doc/python3.11/html), licensed under the PSF License Agreement: real English prose, installable
offline from the distribution mirror, and web pages like RefinedWeb's. Each top-level section of a page (an
<h2> with its subsections, or the text before the first one) becomes one document, which gives the mix of many
short and some very long documents that length subsets and packing need. Documents are chosen by a hash of
their URL (a stable pseudo-random subset, like a crawl sample) until --max-chars characters; the WordPiece
tokenizer is then trained on that subset.
"""

import datetime
import hashlib
import html.parser
import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional

from megatron_neobert.flags import ArgumentParser, add_flags, setting
from megatron_neobert.data.assets import SAMPLE_CORPUS, SAMPLE_TOKENIZER

DOCS_URL = "https://docs.python.org/3.11/"
DUMP = "python-3.11.2-docs"

# Generated pages (indexes, search) are lists of names, not prose.
_SKIP_PAGES = re.compile(r"^(genindex.*|py-modindex|search|contents|copyright|license)\.html$")
_BLOCK_TAGS = {"p", "pre", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "tr",
               "blockquote", "div", "table", "dl", "ul", "ol", "section", "br", "caption"}
_SKIP_TAGS = {"script", "style"}
_LAST_UPDATED = re.compile(r"Last updated on ([A-Z][a-z]{2} \d{1,2}, \d{4})")


@dataclass
class _Doc:
    anchor: str
    parts: List[str] = field(default_factory=list)
    images: List[List[str]] = field(default_factory=list)


class _SectionParser(html.parser.HTMLParser):
    """Collects the text of ``div.body`` split at depth-2 ``<section>`` elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.docs: List[_Doc] = []
        self._body_depth = 0  # div nesting inside div.body; 0 = outside
        self._section_depth = 0
        self._pre = 0
        self._skip = 0  # inside script/style or a pilcrow "headerlink" anchor

    def _current(self) -> _Doc:
        if not self.docs:
            self.docs.append(_Doc(anchor=""))
        return self.docs[-1]

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if self._body_depth == 0:
            if tag == "div" and "body" in (attrs.get("class") or "").split():
                self._body_depth = 1
            return
        if tag == "div":
            self._body_depth += 1
        if tag in _SKIP_TAGS or (tag == "a" and "headerlink" in (attrs.get("class") or "")):
            self._skip += 1
            return
        if tag == "section":
            self._section_depth += 1
            if self._section_depth == 2:
                self.docs.append(_Doc(anchor=attrs.get("id") or ""))
        if tag == "pre":
            self._pre += 1
        if tag == "img" and attrs.get("src"):
            self._current().images.append([attrs["src"], attrs.get("alt") or ""])
        if tag in _BLOCK_TAGS:
            self._current().parts.append("\n")

    def handle_endtag(self, tag):
        if self._body_depth == 0:
            return
        if tag in _SKIP_TAGS or (tag == "a" and self._skip):
            self._skip = max(0, self._skip - 1)
            return
        if tag == "div":
            self._body_depth -= 1
        if tag == "pre":
            self._pre -= 1
        if tag == "section":
            self._section_depth -= 1
        if tag in _BLOCK_TAGS:
            self._current().parts.append("\n")

    def handle_data(self, data):
        if self._body_depth == 0 or self._skip:
            return
        if not self._pre:
            data = re.sub(r"\s+", " ", data)
        self._current().parts.append(data)


def _clean(parts: List[str]) -> str:
    lines = [line.strip() for line in "".join(parts).split("\n")]
    text = "\n".join(lines)
    return re.sub(r"\n{2,}", "\n", text).strip()


def extract_documents(html_dir: str, min_chars: int = 40) -> Iterator[Dict]:
    """Yield RefinedWeb-style records (content, url, timestamp, dump, segment, image_urls).

    Pages are visited in sorted order so the corpus is reproducible; sections shorter than
    ``min_chars`` characters (a heading alone) are dropped.
    """
    for root, dirs, files in os.walk(html_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("_"))
        for name in sorted(files):
            if not name.endswith(".html") or _SKIP_PAGES.match(name):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, html_dir).replace(os.sep, "/")
            with open(path, encoding="utf-8") as f:
                page = f.read()
            match = _LAST_UPDATED.search(page)
            stamp = (datetime.datetime.strptime(match.group(1), "%b %d, %Y") if match
                     else datetime.datetime(2023, 2, 8))
            parser = _SectionParser()
            parser.feed(page)
            page_url = DOCS_URL + rel
            for doc in parser.docs:
                content = _clean(doc.parts)
                if len(content) < min_chars:
                    continue
                base = os.path.dirname(page_url) + "/"
                yield {
                    "content": content,
                    "url": page_url + (f"#{doc.anchor}" if doc.anchor else ""),
                    "timestamp": stamp,
                    "dump": DUMP,
                    "segment": rel.split("/")[0] if "/" in rel else "root",
                    "image_urls": [[base + src, alt] for src, alt in doc.images],
                }


def write_refinedweb_parquet(records: List[Dict], path: str) -> None:
    """Write records with RefinedWeb's column types (timestamp[s], list<list<string>> images)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("content", pa.string()),
        ("url", pa.string()),
        ("timestamp", pa.timestamp("s")),
        ("dump", pa.string()),
        ("segment", pa.string()),
        ("image_urls", pa.list_(pa.list_(pa.string()))),
    ])
    table = pa.Table.from_pylist(records, schema=schema)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(table, path, compression="zstd", compression_level=19)


def train_wordpiece(texts: List[str], out_dir: str, vocab_size: int = 8192,
                    model_max_length: Optional[int] = 4096) -> None:
    """Train a lowercase BERT-style WordPiece tokenizer and save it as a HF tokenizer folder.

    The special tokens come first so their ids match bert-base-uncased's layout where it matters
    to the model: [PAD] = 0 (the embedding's padding_idx).
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer
    from transformers import BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, clean_text=True,
                                                handle_chinese_chars=True, strip_accents=None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials,
                               continuing_subword_prefix="##", show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"trained vocabulary has {tok.get_vocab_size()} entries, "
                           f"wanted {vocab_size}: the corpus is too small")
    # The trainer's id order varies from run to run (hash-map ties) though the entries do not;
    # renumber them (specials, then sorted) so that the script reproduces the shipped files.
    rest = sorted(set(tok.get_vocab()) - set(specials))
    tok.model = models.WordPiece({t: i for i, t in enumerate(specials + rest)}, unk_token="[UNK]",
                                 continuing_subword_prefix="##")
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    fast = BertTokenizerFast(tokenizer_object=tok, do_lower_case=True, unk_token="[UNK]",
                             sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
                             mask_token="[MASK]", model_max_length=model_max_length)
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    # transformers 5 writes only tokenizer.json + tokenizer_config.json; older releases and other
    # tools (Megatron-LM's BertWordPieceTokenizer, the slow BertTokenizer) read these two files.
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(vocab_size))
    with open(os.path.join(out_dir, "vocab.txt"), "w", encoding="utf-8") as f:
        f.writelines(token + "\n" for token, _ in vocab)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]",
                   "sep_token": "[SEP]", "unk_token": "[UNK]"}, f, indent=2)


@dataclass(frozen=True)
class SampleCorpusFlags:
    html_dir: str = setting("/usr/share/doc/python3.11/html",
                            "Python's HTML documentation (Debian's python3.11-doc package)")
    max_chars: int = setting(6_000_000, "stop adding documents past this many characters")
    vocab_size: int = setting(8192, "WordPiece vocabulary size")
    corpus: str = setting(SAMPLE_CORPUS, "the Parquet file to write (RefinedWeb's fields)")
    tokenizer_dir: str = setting(SAMPLE_TOKENIZER, "the tokenizer folder to write")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__)
    add_flags(parser, SampleCorpusFlags)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
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
