"""Tiny NeoBERT Hugging Face folders and WordPiece tokenizers, built offline, for any test file.

    from hf_fixtures import make_neobert_folder
    folder = make_neobert_folder(tmp_path / "neobert", seed=0, num_hidden_layers=1)

`tests/conftest.py` puts this folder on sys.path, so a plain import works from every test module.
"""

from pathlib import Path

import torch

from megatron_neobert.conversion.hf_format import write_hf_folder
from megatron_neobert.hf import NeoBERTConfig, NeoBERTLMHead

WORDS = (
    "the a an of to in and or is are was were be been being it this that these those for on with as by at from "
    "model models token tokens text encoder decoder attention layer layers head heads mask masked language "
    "sentence sentences embedding embeddings vector vectors train training trained data set test tests long "
    "short context window position positions rotary norm weight weights bias value values query key keys "
    "cat cats dog dogs bird birds fish tree trees river rivers mountain city cities house houses road car "
    "red green blue yellow black white small large big little old new good bad fast slow quick lazy happy "
    "run runs ran jump jumps eat eats see sees saw read reads write writes sing sings sleep sleeps"
).split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
# Whole words first-class, letters and ##letters as a fallback so any lowercase text tokenises without [UNK].
VOCAB = SPECIALS + LETTERS + ["##" + c for c in LETTERS] + sorted(set(WORDS) - set(LETTERS))


def tiny_config(**overrides) -> NeoBERTConfig:
    args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72,
                vocab_size=len(VOCAB), max_length=64)
    args.update(overrides)
    return NeoBERTConfig(**args)


def make_tokenizer(dst, model_max_length: int = 64, vocab=VOCAB) -> Path:
    """A BERT-style WordPiece tokenizer ([CLS] a [SEP] b [SEP]) over `vocab`, saved as a HF folder at `dst`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))])
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=model_max_length)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(dst))
    return dst


def random_mlm_state_dict(config: NeoBERTConfig, seed: int = 0, scale: float = None) -> dict:
    """Published-layout weights: a freshly initialised NeoBERTLMHead (the model's own init, seeded), or with
    `scale`, N(0, scale) weights around unit norm gains, large enough that attention depends on positions."""
    torch.manual_seed(seed)
    sd = {k: v.detach().clone() for k, v in NeoBERTLMHead(config).state_dict().items()}
    if scale is not None:
        g = torch.Generator().manual_seed(seed)
        sd = {k: torch.randn(v.shape, generator=g) * scale + (1.0 if k.endswith("norm.weight") else 0.0)
              for k, v in sd.items()}
    return sd


def make_neobert_folder(dst, seed: int = 0, state_dict=None, scale: float = None, tokenizer_dir=None,
                        **config_overrides) -> Path:
    """An exported NeoBERT folder (config with auto_map, weights, modeling code, tokenizer) at `dst`; the
    tokenizer is `tokenizer_dir`, or one over VOCAB made beside `dst`."""
    dst = Path(dst)
    config = tiny_config(**config_overrides)
    if state_dict is None:
        state_dict = random_mlm_state_dict(config, seed, scale)
    if tokenizer_dir is None:
        tokenizer_dir = make_tokenizer(dst.parent / f".{dst.name}-tokenizer", model_max_length=config.max_length)
    return write_hf_folder(dst, state_dict, config, tokenizer_path=tokenizer_dir)
