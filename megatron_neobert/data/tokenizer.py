"""The tokenizers preprocessing and the MLM dataset use: Hugging Face, SentencePiece, or BERT's
WordPiece from a vocab.txt (Megatron-LM's BertWordPieceLowerCase / BertWordPieceCase, whose
``tokenizer_model`` is the vocab file).

``build_tokenizer(tokenizer_type, tokenizer_model)`` returns an object with ``tokenize(text)``
(no special tokens added), ``vocab_size``, the BERT special ids ``pad_id unk_id cls_id sep_id
mask_id``, ``special_ids`` and ``eod_id`` (what ``--append-eod`` appends: the tokenizer's
end-of-sequence token, [SEP] for BERT vocabularies that have none; the ``BertWordPiece*`` types append
[BOS] and [EOS] to the vocabulary and end documents with that [EOS], as Megatron-LM's do). The type names are
Megatron-LM's ``--tokenizer-type`` values; the ``BertWordPiece*`` types read a ``--vocab-file``
(passed as ``tokenizer_model``).

A text longer than ``HUGE_TEXT`` characters is encoded in slices cut before a whitespace, so a
single huge document never holds the backend's per-token records (strings, offsets) for all of
its tokens at once; whitespace-split tokenizers (WordPiece, byte-level BPE) give the same ids.

BERT WordPiece tokenizers (Hugging Face ``bert-base-uncased`` and the ``BertWordPiece*`` types)
encode through ``WordPieceCache``: each distinct whitespace-delimited piece of text is encoded
once and its ids reused, with the ids of whole-document encoding (see its doc).
"""

import dataclasses
import json
import os
import re
from itertools import chain
from typing import Dict, List, Optional, Sequence

import numpy

from megatron_neobert.flags import setting
from megatron_neobert.model_source import check_hub_reachable

# Megatron-LM's WordPiece types: whether they lower-case.
WORDPIECE_TYPES = {"BertWordPieceLowerCase": True, "BertWordPieceCase": False}
NULL_TOKENIZER = "NullTokenizer"
TOKENIZER_TYPES = ("HuggingFaceTokenizer", "SentencePieceTokenizer", *WORDPIECE_TYPES, NULL_TOKENIZER)
# The MLM's special tokens of a NullTokenizer, in the order they follow its end of document where the data has none.
NULL_TOKENIZER_ROLES = ("pad", "cls", "sep", "mask")


@dataclasses.dataclass(frozen=True)
class TokenizerSettings:
    """Megatron-LM's tokenizer flags, for the preprocessor and the trainer alike: data and training must name their
    tokenizer the same way."""

    tokenizer_type: str = setting("HuggingFaceTokenizer", "as Megatron-LM's; BertWordPiece* read --vocab-file; "
                                                          "NullTokenizer (training only) takes the data's ids as "
                                                          "they are, 0 .. --vocab-size - 1", choices=TOKENIZER_TYPES)
    tokenizer_model: str = setting("bert-base-uncased", "Hugging Face name or folder, or a SentencePiece .model file")
    vocab_file: Optional[str] = setting(
        None, "WordPiece vocab.txt for --tokenizer-type BertWordPieceLowerCase / BertWordPieceCase")


def resolve_tokenizer_flags(values: dict, given) -> dict:
    """The tokenizer `values` (TokenizerSettings' fields) as the tokenizer is built: `--vocab-file` alone means
    BertWordPieceLowerCase (Megatron-LM's pretrain_bert.py default), and for the WordPiece types the checked,
    absolute vocab file is the tokenizer's model. `given`: the flags the user gave. Raises ValueError naming the
    flags for a pair that cannot go together."""
    values = dict(values)
    if values["vocab_file"] is not None and "tokenizer_type" not in given:
        values["tokenizer_type"] = "BertWordPieceLowerCase"
    vocab_file = wordpiece_tokenizer_model(values["tokenizer_type"], values["vocab_file"], "tokenizer_model" in given)
    if vocab_file is not None:
        values["vocab_file"] = values["tokenizer_model"] = vocab_file
    return values


HUGE_TEXT = 1 << 18
# Whitespace to cut huge texts before: a split point for every whitespace-split tokenizer (Python's
# \s also matches \x0b \x0c \x1c-\x1f \x85, which BERT's normalizer deletes inside a word).
_SPACE = re.compile("[\t\n\r ]")
_ROLES = ("pad", "unk", "cls", "sep", "mask")
# Pieces a SentencePiece model may use for the BERT special tokens, in order of preference.
_SP_PIECES = {
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
    "cls": ("[CLS]", "<cls>", "<s>"),
    "sep": ("[SEP]", "<sep>", "</s>"),
    "mask": ("[MASK]", "<mask>"),
}


class MLMTokenizer:
    """Common surface of both backends; subclasses set ``vocab_size`` and the special ids."""

    tokenizer_type: str
    tokenizer_model: str
    vocab_size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    eod_id: int

    @property
    def special_ids(self) -> set:
        return {self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id}

    @property
    def unique_identifiers(self) -> Dict:
        # megatron-core hashes the config (tokenizer included) to name its index caches.
        return {"class": type(self).__name__, "tokenizer_type": self.tokenizer_type,
                "tokenizer_model": self.tokenizer_model, "vocab_size": self.vocab_size}

    def tokenize(self, text: str) -> List[int]:
        raise NotImplementedError

    def tokenize_batch(self, texts: Sequence[str]) -> List[List[int]]:
        return [self.tokenize(text) for text in texts]

    def tokenize_documents(self, texts: Sequence[str]) -> List[Sequence[int]]:
        """``tokenize_batch``, with huge texts encoded slice by slice (see the module doc)."""
        huge = [i for i, text in enumerate(texts) if len(text) > HUGE_TEXT]
        if not huge:
            return self.tokenize_batch(texts)
        ids = self.tokenize_batch([t if len(t) <= HUGE_TEXT else "" for t in texts])
        for i in huge:  # numpy: a few bytes per token, where a list of ints holds ~36
            ids[i] = numpy.concatenate([numpy.asarray(self.tokenize_batch([part])[0], numpy.int64)
                                        for part in _slices(texts[i])])
        return ids

    def __getstate__(self):
        # Rebuild from (type, model) in DataLoader / preprocessing workers instead of pickling
        # backend objects, which not every backend version supports.
        return {"tokenizer_type": self.tokenizer_type, "tokenizer_model": self.tokenizer_model}

    def __setstate__(self, state):
        self.__dict__.update(build_tokenizer(**state).__dict__)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.tokenizer_model!r}, vocab_size={self.vocab_size}, "
                f"pad={self.pad_id}, cls={self.cls_id}, sep={self.sep_id}, mask={self.mask_id})")


def _batch_encoder(backend):
    """The backend's batch encoding: encode_batch_fast (tokenizers >= 0.21) skips the character
    offsets, 3-4x faster."""
    return getattr(backend, "encode_batch_fast", backend.encode_batch)


def _slices(text: str):
    """``text`` cut before a whitespace about every ``HUGE_TEXT`` characters."""
    start = 0
    while len(text) - start > HUGE_TEXT:
        space = _SPACE.search(text, start + HUGE_TEXT)
        if space is None:
            break
        yield text[start:space.start()]
        start = space.start()
    yield text[start:]


class WordPieceCache:
    """Encodes with a BERT WordPiece backend one distinct piece of text at a time, where a piece
    is a run of characters between BERT whitespace.

    BERT's normalizer works character by character (it deletes control characters and turns
    whitespace into spaces) and its pre-tokenizer splits at every whitespace and punctuation
    character, so a piece tokenizes alone exactly as inside its document, and so does each part
    of a piece cut at ASCII punctuation (unless a special token such as [MASK] spans the cut). A
    corpus repeats its words: after a few batches nearly every piece is a dictionary hit, and the
    backend (normalizer, pre-tokenizer, WordPiece) runs only on the parts of the new ones. The
    work per document is C-level (split, set difference, dictionary lookups); the cache holds at
    most ``max_pieces`` pieces and starts over when full.
    """

    # What BERT's normalizer turns into a space: \t \n \r and Unicode White_Space outside the
    # control characters (those it deletes). Python's str.split() splits at all of these and also
    # at the control characters below, so it is used for texts without them.
    _PIECE = re.compile("[^\t\n\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
    _CONTROL_SPACE = re.compile("[\x0b\x0c\x1c-\x1f\x85]")
    # ASCII punctuation (BERT's in every Unicode version), and the runs between it.
    _PARTS = re.compile(r"[!-/:-@\[-`{-~]|[^!-/:-@\[-`{-~]+")
    # New parts are encoded as one text joined by this special token: a call per part costs the
    # backend ~10 us, more than the part. Its content holds a space, so no piece can contain it,
    # and the text around a special token is encoded segment by segment.
    _BOUNDARY = "<piece boundary>"

    def __init__(self, backend, max_pieces: int = 1 << 19) -> None:
        from tokenizers import AddedToken, Tokenizer

        self._joined = Tokenizer.from_str(backend.to_str())
        specials = sorted(self._joined.get_added_tokens_decoder().values(), key=lambda t: -len(t.content))
        self._special = re.compile("|".join(re.escape(t.content) for t in specials)) if specials else None
        self._joined.add_special_tokens([AddedToken(self._BOUNDARY, special=True, normalized=False)])
        self._boundary_id = self._joined.token_to_id(self._BOUNDARY)
        self._max_pieces = max_pieces
        self._ids: Dict[str, tuple] = {}  # tuples of ints: the garbage collector skips them

    @staticmethod
    def applies_to(backend) -> bool:
        """Whether pieces encode as in context: BERT normalizer (with clean_text), pre-tokenizer
        and WordPiece model; no truncation or padding; added tokens matched on the raw text,
        without whitespace and without left/right stripping."""
        config = json.loads(backend.to_str())
        normalizer, pre_tokenizer = config.get("normalizer") or {}, config.get("pre_tokenizer") or {}
        return (normalizer.get("type") == "BertNormalizer" and normalizer.get("clean_text") is True
                and pre_tokenizer.get("type") == "BertPreTokenizer"
                and config["model"].get("type") == "WordPiece"
                and backend.truncation is None and backend.padding is None
                and all(not (token["lstrip"] or token["rstrip"] or token["normalized"])
                        and token["content"].split() == [token["content"]]
                        for token in config.get("added_tokens", [])))

    def _pieces(self, text: str) -> List[str]:
        return text.split() if self._CONTROL_SPACE.search(text) is None else self._PIECE.findall(text)

    def _encode_parts(self, parts: List[str]) -> List[tuple]:
        ids = _batch_encoder(self._joined)([self._BOUNDARY.join(parts)], add_special_tokens=False)[0].ids
        ends = numpy.flatnonzero(numpy.asarray(ids) == self._boundary_id).tolist() + [len(ids)]
        return [tuple(ids[start + 1:end]) for start, end in zip([-1] + ends[:-1], ends)]

    def _encode_pieces(self, pieces: List[str]) -> List[tuple]:
        special = self._special
        parts = [[piece] if special is not None and special.search(piece) else self._PARTS.findall(piece)
                 for piece in pieces]
        unique = list(set().union(*parts))
        part_ids = dict(zip(unique, self._encode_parts(unique))).__getitem__
        # Most pieces are one part (a word without punctuation): its ids as they are, without a chain (a tenth
        # of the time of a cold cache).
        return [part_ids(piece_parts[0]) if len(piece_parts) == 1 else tuple(chain.from_iterable(map(
            part_ids, piece_parts))) for piece_parts in parts]

    def encode(self, texts: Sequence[str]) -> List[List[int]]:
        pieces = [self._pieces(text) for text in texts]
        new = list(set().union(*pieces).difference(self._ids))
        if len(self._ids) + len(new) > self._max_pieces:
            self._ids.clear()
            new = list(set().union(*pieces))
        if new:
            self._ids.update(zip(new, self._encode_pieces(new)))
        ids = self._ids.__getitem__
        return [list(chain.from_iterable(map(ids, doc))) for doc in pieces]


def load_auto_tokenizer(name_or_path: str):
    """`AutoTokenizer.from_pretrained` that runs no model code. A NeoBERT folder (an export, the released
    model) names a standard tokenizer class, but its config.json needs NeoBERT's modeling code, which
    AutoTokenizer reads first: it would ask whether to run that code and, refused, warn of a model of
    type ''. The tokenizer needs neither."""
    from transformers import AutoConfig, AutoTokenizer, PretrainedConfig

    try:
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=False)
    except ValueError:  # a config that needs its own code: the tokenizer class is tokenizer_config.json's
        config = PretrainedConfig()
    except OSError:  # no config.json: a tokenizer-only folder
        config = None
    return AutoTokenizer.from_pretrained(name_or_path, config=config, trust_remote_code=False)


class HuggingFaceMLMTokenizer(MLMTokenizer):
    tokenizer_type = "HuggingFaceTokenizer"

    def __init__(self, tokenizer_model: str) -> None:
        self.tokenizer_model = tokenizer_model
        try:
            self._tok = self._load(tokenizer_model)
        except Exception as err:  # OSError, ValueError, HTTP errors: all mean "cannot load it"
            raise ValueError(f"cannot load Hugging Face tokenizer {tokenizer_model!r} (offline "
                             f"runs need a local folder or a cached name): {err}") from err
        # The fast backend encodes without the max-length warning and much faster in batches.
        self._backend = getattr(self._tok, "backend_tokenizer", None) if self._tok.is_fast else None
        self._word_pieces = (WordPieceCache(self._backend)
                             if self._backend is not None and WordPieceCache.applies_to(self._backend) else None)
        self.vocab_size = len(self._tok)
        ids = {role: getattr(self._tok, f"{role}_token_id") for role in _ROLES}
        missing = [role for role, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"tokenizer {tokenizer_model!r} has no {', '.join(missing)} token; "
                             "MLM pre-training needs [PAD] [UNK] [CLS] [SEP] [MASK]")
        for role, i in ids.items():
            setattr(self, f"{role}_id", int(i))
        eos = self._tok.eos_token_id
        self.eod_id = int(eos) if eos is not None else self.sep_id

    @staticmethod
    def _load(tokenizer_model: str):
        check_hub_reachable(tokenizer_model)
        return load_auto_tokenizer(tokenizer_model)

    def tokenize(self, text: str) -> List[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self._tok.encode(text, add_special_tokens=False)

    def tokenize_batch(self, texts: Sequence[str]) -> List[List[int]]:
        if self._word_pieces is not None:
            return self._word_pieces.encode(texts)
        if self._backend is not None:
            return [e.ids for e in _batch_encoder(self._backend)(list(texts), add_special_tokens=False)]
        return super().tokenize_batch(texts)


def check_wordpiece_vocab(vocab_file: str) -> None:
    """A readable vocab.txt with BERT's special tokens, checked before anything is built."""
    if not os.path.isfile(vocab_file):
        raise ValueError(f"--vocab-file {vocab_file!r} not found")
    with open(vocab_file, encoding="utf-8") as f:
        tokens = {line.rstrip("\n") for line in f}
    missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t not in tokens]
    if missing:
        raise ValueError(f"--vocab-file {vocab_file!r} lacks {', '.join(missing)}: MLM pre-training "
                         "needs [PAD] [UNK] [CLS] [SEP] [MASK] (one token per line)")


def wordpiece_tokenizer_model(tokenizer_type: str, vocab_file: Optional[str], tokenizer_model_given: bool
                              ) -> Optional[str]:
    """Megatron-LM's --tokenizer-type / --vocab-file pair: for the WordPiece types the vocab file (absolute,
    checked) is the tokenizer to build; for the others None (--tokenizer-model names it). Raises ValueError
    naming the flags for a pair that cannot go together."""
    if tokenizer_type not in WORDPIECE_TYPES:
        if vocab_file is not None:
            raise ValueError(f"--vocab-file is read by --tokenizer-type {' / '.join(WORDPIECE_TYPES)}, not "
                             f"{tokenizer_type} (use --tokenizer-model)")
        return None
    if vocab_file is None:
        raise ValueError(f"--tokenizer-type {tokenizer_type} needs --vocab-file (a WordPiece vocab.txt)")
    if tokenizer_model_given:
        raise ValueError(f"--tokenizer-type {tokenizer_type} reads --vocab-file, not --tokenizer-model")
    vocab_file = os.path.abspath(vocab_file)
    check_wordpiece_vocab(vocab_file)
    return vocab_file


class BertWordPieceMLMTokenizer(HuggingFaceMLMTokenizer):
    """Megatron-LM's BertWordPieceLowerCase / BertWordPieceCase: WordPiece from a vocab.txt
    (``--vocab-file``), through the tokenizers library's BERT normaliser, pre-tokeniser and model."""

    def __init__(self, vocab_file: str, tokenizer_type: str) -> None:
        check_wordpiece_vocab(vocab_file)
        self.tokenizer_type = tokenizer_type
        super().__init__(vocab_file)
        # Megatron-LM's BERT tokenizers append [BOS] and [EOS] to the vocabulary (unless the file has them) and
        # end a document with [EOS] under --append-eod: the same ids and vocabulary size here, so that its data
        # and ours carry the same ids and pad the embedding alike.
        self.base_vocab_size, vocab = self.vocab_size, self._tok.get_vocab()
        for role, token in (("bos", "[BOS]"), ("eos", "[EOS]")):
            if token not in vocab:
                vocab[token] = self.vocab_size
                self.vocab_size += 1
            setattr(self, f"{role}_id", vocab[token])
        self.eod_id = self.eos_id

    def _load(self, vocab_file: str):
        from tokenizers import BertWordPieceTokenizer
        from transformers import PreTrainedTokenizerFast

        backend = BertWordPieceTokenizer(vocab_file, lowercase=WORDPIECE_TYPES[self.tokenizer_type])
        return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", sep_token="[SEP]",
                                       pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")


class SentencePieceMLMTokenizer(MLMTokenizer):
    tokenizer_type = "SentencePieceTokenizer"

    def __init__(self, tokenizer_model: str) -> None:
        import sentencepiece

        self.tokenizer_model = tokenizer_model
        if not os.path.isfile(tokenizer_model):
            raise ValueError(f"SentencePiece model file {tokenizer_model!r} not found")
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=tokenizer_model)
        except Exception as err:
            raise ValueError(f"cannot load SentencePiece model {tokenizer_model!r}: {err}") from err
        self.vocab_size = self._sp.get_piece_size()
        missing = []
        for role in _ROLES:
            found = self._find_piece(_SP_PIECES[role])
            if found is None:
                missing.append(f"{role} (one of {', '.join(_SP_PIECES[role])})")
            setattr(self, f"{role}_id", found)
        if missing:
            raise ValueError(
                f"SentencePiece model {tokenizer_model!r} lacks BERT special pieces: "
                f"{'; '.join(missing)}. Train it with e.g. --user_defined_symbols=[CLS],[SEP],[MASK] "
                "and --pad_id=0 --pad_piece=[PAD] --unk_piece=[UNK].")
        eos = self._sp.eos_id()
        self.eod_id = int(eos) if 0 <= eos < self.vocab_size else self.sep_id

    def _find_piece(self, pieces) -> Optional[int]:
        for piece in pieces:
            i = self._sp.piece_to_id(piece)
            # piece_to_id answers the unk id for pieces it does not know.
            if 0 <= i < self.vocab_size and self._sp.id_to_piece(i) == piece:
                return int(i)
        return None

    def tokenize(self, text: str) -> List[int]:
        return self._sp.encode(text, out_type=int)

    def tokenize_batch(self, texts: Sequence[str]) -> List[List[int]]:
        return self._sp.encode(list(texts), out_type=int)


def null_tokenizer_model(vocab_size: int, special_ids: Dict[str, Optional[int]]) -> str:
    """The description a NullTokenizer is built from (its `tokenizer_model`): `vocab_size=N,pad=..,cls=..,sep=..,
    mask=..`.
    `special_ids`: {role: the data's id, or None}; a role the data has no id for takes its place after the data's
    ids 0 .. N-1 and Megatron-LM's end of document at N: [PAD] N+1, [CLS] N+2, [SEP] N+3, [MASK] N+4. Raises
    ValueError naming the flag of an id that cannot be one."""
    if vocab_size < 1:
        raise ValueError(f"--vocab-size {vocab_size}: the NullTokenizer needs at least one id")
    ids = {}
    for offset, role in enumerate(NULL_TOKENIZER_ROLES, start=1):
        given = special_ids.get(role)
        if given is not None and not 0 <= given < vocab_size:
            raise ValueError(f"--null-tokenizer-{role}-id {given}: the data's ids are 0 .. {vocab_size - 1} "
                             f"(--vocab-size {vocab_size}); leave the flag out for an id of its own "
                             f"({vocab_size + offset})")
        ids[role] = vocab_size + offset if given is None else given
    shared = {i for i in ids.values() if list(ids.values()).count(i) > 1}
    if shared:
        roles = [f"--null-tokenizer-{role}-id" for role, i in ids.items() if i in shared]
        raise ValueError(f"{' and '.join(roles)} name the same id {shared.pop()}: each special token needs its own")
    return ",".join([f"vocab_size={vocab_size}"] + [f"{role}={i}" for role, i in ids.items()])


class NullMLMTokenizer(MLMTokenizer):
    """Megatron-LM's NullTokenizer for mock and already tokenized data: ids are taken as they are. As megatron-core
    0.16's, `--vocab-size N` means the data's ids 0 .. N-1 and the end of document at N; the MLM's [PAD] [CLS]
    [SEP] [MASK] are the data's ids where named, else follow (see `null_tokenizer_model`), and the vocabulary ends at
    the largest id. No text is tokenized, and there is no unknown token (its id is [PAD]'s)."""

    tokenizer_type = NULL_TOKENIZER

    def __init__(self, tokenizer_model: str) -> None:
        self.tokenizer_model = tokenizer_model
        try:
            fields = dict(item.split("=") for item in tokenizer_model.split(","))
            ids = {role: int(fields[role]) for role in ("vocab_size", *NULL_TOKENIZER_ROLES)}
        except (KeyError, ValueError):
            raise ValueError(f"{tokenizer_model!r} is no NullTokenizer description (vocab_size=N,pad=..,cls=..,"
                             f"sep=..,mask=..): the trainer makes it from --vocab-size") from None
        self.base_vocab_size = self.eod_id = ids.pop("vocab_size")
        for role, i in ids.items():
            setattr(self, f"{role}_id", i)
        self.unk_id = self.pad_id
        self.vocab_size = max(self.eod_id, *ids.values()) + 1

    @property
    def special_ids(self) -> set:
        return super().special_ids | {self.eod_id}  # never masked, nor a mock document's token

    def describe(self) -> str:
        """The ids in words, for the start-up log."""
        return (f"NullTokenizer: the data's ids 0 .. {self.base_vocab_size - 1} taken as they are; end of document "
                f"{self.eod_id}, [PAD] {self.pad_id}, [CLS] {self.cls_id}, [SEP] {self.sep_id}, [MASK] "
                f"{self.mask_id}; vocabulary {self.vocab_size}")


def build_tokenizer(tokenizer_type: str, tokenizer_model: str) -> MLMTokenizer:
    """Load a tokenizer by Megatron-LM type name and model (HF name/folder, .model file or vocab.txt)."""
    if tokenizer_type == "HuggingFaceTokenizer":
        return HuggingFaceMLMTokenizer(tokenizer_model)
    if tokenizer_type == "SentencePieceTokenizer":
        return SentencePieceMLMTokenizer(tokenizer_model)
    if tokenizer_type in WORDPIECE_TYPES:
        return BertWordPieceMLMTokenizer(tokenizer_model, tokenizer_type)
    if tokenizer_type == NULL_TOKENIZER:
        return NullMLMTokenizer(tokenizer_model)
    raise ValueError(f"unknown tokenizer type {tokenizer_type!r}; expected one of {TOKENIZER_TYPES}")
