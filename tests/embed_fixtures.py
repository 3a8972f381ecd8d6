"""Tiny offline NeoBERT folders and WordPiece tokenizers for the embedding tests (contrastive, MTEB, CDE)."""

import importlib.util
from pathlib import Path

import torch

from megatron_neobert.conversion.hf_format import write_hf_folder
from megatron_neobert.conversion.modeling_neobert import NeoBERTConfig, NeoBERTLMHead

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
N_TOPICS = 24
# Queries and passages use disjoint words ("qwK" asks about topic K, "pwK" answers it), so a random model cannot
# match them and any retrieval skill must be learned.
QUERY_WORDS = [f"qw{i}" for i in range(N_TOPICS)]
PASSAGE_WORDS = [f"pw{i}" for i in range(N_TOPICS)]
WORDS = ("instruct query retrieve semantically similar text given a the of and is with about cat dog "
         "bird fish red blue green car road city river tree house").split()
VOCAB = SPECIALS + list(".,:;!?") + QUERY_WORDS + PASSAGE_WORDS + WORDS


def make_tokenizer(path, vocab=VOCAB, max_length=64):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_length)
    fast.save_pretrained(str(path))
    return path


def tiny_config(**kw):
    args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72,
                vocab_size=len(VOCAB), max_length=64)
    args.update(kw)
    return NeoBERTConfig(**args)


def make_model_folder(path, seed=0, tokenizer_dir=None, **config_kw):
    """A randomly initialised (NeoBERT's own init) tiny model written as an exported HF folder."""
    config = tiny_config(**config_kw)
    torch.manual_seed(seed)
    model = NeoBERTLMHead(config)
    if tokenizer_dir is None:
        tokenizer_dir = make_tokenizer(path.parent / (path.name + "-tokenizer"))
    return write_hf_folder(path, model.state_dict(), config, tokenizer_path=tokenizer_dir)


def topic_pairs(pairs):
    """Query/passage texts for topic pairs (a, b): 'qwA qwB' should retrieve 'pwA pwB'."""
    queries = [f"{QUERY_WORDS[a]} {QUERY_WORDS[b]}" for a, b in pairs]
    passages = [f"{PASSAGE_WORDS[a]} {PASSAGE_WORDS[b]}" for a, b in pairs]
    return queries, passages


def load_tool(name):
    """tools/<name>.py as a module (tools/ is a folder of scripts, not a package)."""
    path = Path(__file__).resolve().parent.parent / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
