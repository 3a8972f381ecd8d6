"""Tiny offline NeoBERT folders and WordPiece tokenizers for the embedding tests (contrastive, MTEB, CDE)."""

import importlib.util
from pathlib import Path

import hf_fixtures  # tests/ is on sys.path (conftest.py)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
N_TOPICS = 24
# Queries and passages use disjoint words ("qwK" asks about topic K, "pwK" answers it), so a random model cannot
# match them and any retrieval skill must be learned.
QUERY_WORDS = [f"qw{i}" for i in range(N_TOPICS)]
PASSAGE_WORDS = [f"pw{i}" for i in range(N_TOPICS)]
WORDS = ("instruct query retrieve semantically similar text given a the of and is with about cat dog "
         "bird fish red blue green car road city river tree house").split()
VOCAB = SPECIALS + list(".,:;!?") + QUERY_WORDS + PASSAGE_WORDS + WORDS


def make_tokenizer(path):
    """A WordPiece tokenizer over this module's vocabulary."""
    return hf_fixtures.make_tokenizer(path, vocab=VOCAB)


def make_model_folder(path, seed=0, tokenizer_dir=None, **config_kw):
    """A randomly initialised (NeoBERT's own init) tiny model over this module's vocabulary, as an exported HF
    folder."""
    if tokenizer_dir is None:
        tokenizer_dir = make_tokenizer(path.parent / (path.name + "-tokenizer"))
    return hf_fixtures.make_neobert_folder(path, seed=seed, tokenizer_dir=tokenizer_dir,
                                           **{"vocab_size": len(VOCAB), **config_kw})


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
