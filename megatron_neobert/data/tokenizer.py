"""The tokenizers preprocessing and the MLM dataset use: Hugging Face, SentencePiece, or BERT's
WordPiece from a vocab.txt (Megatron-LM's BertWordPieceLowerCase / BertWordPieceCase, whose
``tokenizer_model`` is the vocab file).

``build_tokenizer(tokenizer_type, tokenizer_model)`` returns an object with ``tokenize(text)``
(no special tokens added), ``vocab_size``, the BERT special ids ``pad_id unk_id cls_id sep_id
mask_id`` and ``special_ids``. The type names are Megatron-LM's ``--tokenizer-type`` values.
"""

import os
from typing import Dict, List, Optional, Sequence

# Megatron-LM's WordPiece types: whether they lower-case.
WORDPIECE_TYPES = {"BertWordPieceLowerCase": True, "BertWordPieceCase": False}
TOKENIZER_TYPES = ("HuggingFaceTokenizer", "SentencePieceTokenizer", *WORDPIECE_TYPES)
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

    def detokenize(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def __getstate__(self):
        # Rebuild from (type, model) in DataLoader / preprocessing workers instead of pickling
        # backend objects, which not every backend version supports.
        return {"tokenizer_type": self.tokenizer_type, "tokenizer_model": self.tokenizer_model}

    def __setstate__(self, state):
        self.__dict__.update(build_tokenizer(**state).__dict__)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.tokenizer_model!r}, vocab_size={self.vocab_size}, "
                f"pad={self.pad_id}, cls={self.cls_id}, sep={self.sep_id}, mask={self.mask_id})")


class HuggingFaceMLMTokenizer(MLMTokenizer):
    tokenizer_type = "HuggingFaceTokenizer"

    def __init__(self, tokenizer_model: str) -> None:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(tokenizer_model)
        except Exception as err:  # OSError, ValueError, HTTP errors: all mean "cannot load it"
            raise ValueError(f"cannot load Hugging Face tokenizer {tokenizer_model!r} (offline "
                             f"runs need a local folder or a cached name): {err}") from err
        self._wrap(tok, tokenizer_model)

    def _wrap(self, tok, tokenizer_model: str) -> None:
        self.tokenizer_model, self._tok = tokenizer_model, tok
        # The fast backend encodes without the max-length warning and much faster in batches.
        self._backend = getattr(self._tok, "backend_tokenizer", None) if self._tok.is_fast else None
        self.vocab_size = len(self._tok)
        ids = {role: getattr(self._tok, f"{role}_token_id") for role in _ROLES}
        missing = [role for role, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"tokenizer {tokenizer_model!r} has no {', '.join(missing)} token; "
                             "MLM pre-training needs [PAD] [UNK] [CLS] [SEP] [MASK]")
        for role, i in ids.items():
            setattr(self, f"{role}_id", int(i))

    def tokenize(self, text: str) -> List[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self._tok.encode(text, add_special_tokens=False)

    def tokenize_batch(self, texts: Sequence[str]) -> List[List[int]]:
        if self._backend is not None:
            return [e.ids for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]
        return super().tokenize_batch(texts)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))


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


class BertWordPieceMLMTokenizer(HuggingFaceMLMTokenizer):
    """Megatron-LM's BertWordPieceLowerCase / BertWordPieceCase: WordPiece from a vocab.txt."""

    def __init__(self, vocab_file: str, tokenizer_type: str) -> None:
        from tokenizers import BertWordPieceTokenizer
        from transformers import PreTrainedTokenizerFast

        check_wordpiece_vocab(vocab_file)
        self.tokenizer_type = tokenizer_type
        # BERT's normaliser, pre-tokeniser and WordPiece model; wrapped so the base class's surface works.
        backend = BertWordPieceTokenizer(vocab_file, lowercase=WORDPIECE_TYPES[tokenizer_type])
        self._wrap(PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", sep_token="[SEP]",
                                           pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]"), vocab_file)


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

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._sp.decode(list(ids))


def build_tokenizer(tokenizer_type: str, tokenizer_model: str) -> MLMTokenizer:
    """Load a tokenizer by Megatron-LM type name and model (HF name/folder, .model file or vocab.txt)."""
    if tokenizer_type == "HuggingFaceTokenizer":
        return HuggingFaceMLMTokenizer(tokenizer_model)
    if tokenizer_type == "SentencePieceTokenizer":
        return SentencePieceMLMTokenizer(tokenizer_model)
    if tokenizer_type in WORDPIECE_TYPES:
        return BertWordPieceMLMTokenizer(tokenizer_model, tokenizer_type)
    raise ValueError(f"unknown tokenizer type {tokenizer_type!r}; expected one of {TOKENIZER_TYPES}")
