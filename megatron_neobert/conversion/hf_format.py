"""Hugging Face folders for NeoBERT: the published layout (`chandar-lab/NeoBERT` key names, see
`expected_hf_shapes`), config.json, writing and reading a folder. The mapping to and from megatron-core state
dicts is `state_dict_mapping.py`.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import torch

from ..atomic_write import atomic_path
from ..hf import NeoBERTConfig
from ..model_source import check_model_source

PathLike = Union[str, os.PathLike]
StateDict = Dict[str, torch.Tensor]

# The generated transformers files, copied into each export for users who load it with remote code.
MODEL_FILES = tuple(Path(__file__).parents[1] / "hf" / name for name in ("configuration_neobert.py",
                                                                        "modeling_neobert.py"))

AUTO_MAP = {
    "AutoConfig": "configuration_neobert.NeoBERTConfig",
    "AutoModel": "modeling_neobert.NeoBERT",
    "AutoModelForMaskedLM": "modeling_neobert.NeoBERTLMHead",
    "AutoModelForSequenceClassification": "modeling_neobert.NeoBERTForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_neobert.NeoBERTForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_neobert.NeoBERTForQuestionAnswering",
    "AutoModelForMultipleChoice": "modeling_neobert.NeoBERTForMultipleChoice",
}

WEIGHT_SUFFIXES = (".safetensors", ".bin")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "spiece.model", "tokenizer.model",
)

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
BIN_WEIGHTS_NAME = "pytorch_model.bin"
BIN_WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"


# --------------------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------------------


def expected_hf_shapes(config: NeoBERTConfig, with_head: bool = True) -> Dict[str, Tuple[int, ...]]:
    """Key -> shape of the published layout for `config` (172 tensors for the 28-layer model)."""
    h, f, v = config.hidden_size, config.ffn_hidden_size, config.vocab_size
    shapes = {"model.encoder.weight": (v, h)}
    for i in range(config.num_hidden_layers):
        p = f"model.transformer_encoder.{i}."
        shapes[p + "attention_norm.weight"] = (h,)
        shapes[p + "qkv.weight"] = (3 * h, h)
        shapes[p + "wo.weight"] = (h, h)
        shapes[p + "ffn_norm.weight"] = (h,)
        shapes[p + "ffn.w12.weight"] = (2 * f, h)
        shapes[p + "ffn.w3.weight"] = (h, f)
    shapes["model.layer_norm.weight"] = (h,)
    if with_head:
        shapes["decoder.weight"] = (v, h)
        shapes["decoder.bias"] = (v,)
    return shapes


def validate_hf_state_dict(state_dict: StateDict, config: NeoBERTConfig, where: str = "state dict") -> None:
    """Raises ValueError naming what differs from the published layout (the MLM head is optional)."""
    emb = state_dict.get("model.encoder.weight")
    if emb is not None and emb.shape[0] != config.vocab_size:
        raise ValueError(
            f"{where}: vocab size mismatch: config has vocab_size={config.vocab_size} but model.encoder.weight "
            f"has {emb.shape[0]} rows"
        )
    expected = expected_hf_shapes(config, with_head="decoder.weight" in state_dict or "decoder.bias" in state_dict)
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    wrong = sorted(
        f"{k}: {tuple(state_dict[k].shape)} instead of {expected[k]}"
        for k in set(expected) & set(state_dict)
        if tuple(state_dict[k].shape) != expected[k]
    )
    problems = []
    if missing:
        problems.append(f"missing keys {_abbrev(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_abbrev(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes {_abbrev(wrong)}")
    if problems:
        raise ValueError(f"{where} is not a NeoBERT checkpoint for this config: " + "; ".join(problems))


def _abbrev(items, limit: int = 6) -> str:
    items = list(items)
    more = f" ... and {len(items) - limit} more" if len(items) > limit else ""
    return "[" + ", ".join(items[:limit]) + more + "]"


# --------------------------------------------------------------------------------------------------------
# Writing a folder
# --------------------------------------------------------------------------------------------------------


def hf_config_dict(config: NeoBERTConfig, dtype: torch.dtype = torch.float32) -> dict:
    """The config.json content: every field (the published ones under their published names), and auto_map for
    users who load with remote code."""
    d = config.to_dict()
    for name in ("_name_or_path", "transformers_version", "dtype", "output_attentions"):
        d.pop(name, None)  # "torch_dtype" below is read by every transformers 5 release
    d.update(
        model_type="neobert",
        architectures=["NeoBERTLMHead"],
        auto_map=dict(AUTO_MAP),
        torch_dtype=str(dtype).replace("torch.", ""),
    )
    return dict(sorted(d.items()))


def _sentence_transformers_files(config: NeoBERTConfig) -> Dict[str, dict]:
    versions = {}
    for package in ("sentence_transformers", "transformers", "torch"):
        try:
            from importlib.metadata import version

            versions[package if package != "torch" else "pytorch"] = version(package.replace("_", "-"))
        except Exception:
            pass
    return {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ],
        "sentence_bert_config.json": {"max_seq_length": config.max_length, "do_lower_case": False},
        "1_Pooling/config.json": {
            "word_embedding_dimension": config.hidden_size,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,  # the paper evaluates embeddings with mean pooling
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False,
            "include_prompt": True,
        },
        "config_sentence_transformers.json": {
            "__version__": versions,
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    }


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:  # into a folder that atomic_path commits whole
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def _copy_tokenizer(tokenizer_path: PathLike, dst: Path, config: NeoBERTConfig) -> None:
    src = Path(tokenizer_path)
    if not src.is_dir():
        raise FileNotFoundError(f"tokenizer_path {src} is not a folder")
    found = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    if not found:
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {src}")
    if "tokenizer.json" in found:
        from tokenizers import Tokenizer

        n = Tokenizer.from_file(str(src / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
        if n > config.vocab_size:
            raise ValueError(f"tokenizer in {src} has {n} tokens but the model's vocab_size is {config.vocab_size}")
    for name in found:
        shutil.copyfile(src / name, dst / name)
    if (dst / "tokenizer_config.json").is_file():
        _standardise_tokenizer_config(dst / "tokenizer_config.json", config.max_length)


def _standardise_tokenizer_config(path: Path, max_length: int) -> None:
    """Lets the tokenizer load on its own, with a standard class: `TokenizersBackend` (the name transformers 5
    saves) becomes `PreTrainedTokenizerFast`, which transformers 4 and 5 both resolve (4.x then skips the
    model's remote-code config); NeoBERT's inputs are declared (it has no token types); and the tokenizer
    announces the model's length, as config.json's max_length and sentence_bert_config.json's
    max_seq_length do."""
    config = _read_json(path)
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_input_names"] = ["input_ids", "attention_mask"]
    config["model_max_length"] = max_length
    _write_json(path, config)


def _save_safetensors(state_dict: StateDict, path: Path, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for k, v in state_dict.items():
        t = v.detach().to(device="cpu", dtype=dtype).contiguous()
        if t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone()  # a view into a larger (e.g. vocab-padded) tensor: store only its own rows
        tensors[k] = t
    save_file(tensors, str(path), metadata={"format": "pt"})


def write_hf_folder(
    dst: PathLike,
    hf_state_dict: StateDict,
    config: NeoBERTConfig,
    tokenizer_path: Optional[PathLike] = None,
    dtype: torch.dtype = torch.float32,
    overwrite: bool = False,
) -> Path:
    """Writes a `trust_remote_code` NeoBERT folder (config, weights, modeling code, tokenizer,
    sentence-transformers mean-pooling config) atomically: built in a temporary sibling, renamed at the end."""
    dst = Path(dst)
    if dst.exists() and not overwrite:
        raise FileExistsError(f"{dst} already exists; pass overwrite=True to replace it")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if "decoder.weight" not in hf_state_dict:
        raise ValueError("the state dict has no MLM head (decoder.weight / decoder.bias); export expects NeoBERTLMHead")
    validate_hf_state_dict(hf_state_dict, config)

    with atomic_path(dst) as tmp:
        tmp.mkdir()
        _write_json(tmp / "config.json", hf_config_dict(config, dtype))
        _save_safetensors(hf_state_dict, tmp / WEIGHTS_NAME, dtype)
        for source in MODEL_FILES:
            shutil.copyfile(source, tmp / source.name)
        if tokenizer_path is not None:
            _copy_tokenizer(tokenizer_path, tmp, config)
        for name, content in _sentence_transformers_files(config).items():
            _write_json(tmp / name, content)
    return dst


# --------------------------------------------------------------------------------------------------------
# Reading a folder
# --------------------------------------------------------------------------------------------------------


def _load_weight_file(path: Path) -> StateDict:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(str(path), map_location="cpu", weights_only=True)


def _read_json(path: Path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err})") from None


def _load_sharded(src: Path, index_name: str) -> StateDict:
    weight_map = _read_json(src / index_name)["weight_map"]
    state_dict = {}
    for shard in sorted(set(weight_map.values())):
        if not (src / shard).is_file():
            raise FileNotFoundError(f"shard {shard} listed in {src / index_name} is missing")
        part = _load_weight_file(src / shard)
        listed = {k for k, s in weight_map.items() if s == shard}
        if set(part) != listed:
            raise ValueError(f"shard {shard} holds keys {_abbrev(sorted(set(part) ^ listed))} not matching {index_name}")
        state_dict.update(part)
    return state_dict


def neobert_config(config_dict: dict, path: Path) -> NeoBERTConfig:
    """The config of `path`'s fields; a value of the wrong kind ("hidden_size": "big") is a ValueError naming
    the file."""
    from huggingface_hub.errors import StrictDataclassError

    try:
        return NeoBERTConfig.from_dict(config_dict)
    except (ValueError, StrictDataclassError) as err:  # the strict dataclass's message spans lines
        raise ValueError(f"{path}: {' '.join(str(err).split())}") from None


def load_neobert_auto_config(folder: PathLike) -> NeoBERTConfig:
    """The config of a NeoBERT folder (ours or the published layout), read by this package's NeoBERTConfig
    without remote code; a clear error for anything else."""
    check_model_source(folder)
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{folder} is not a loadable Hugging Face model folder: it has no config.json")
    config_dict = _read_json(config_file)
    if config_dict.get("model_type") != "neobert":
        raise ValueError(f"{folder} is not NeoBERT-compatible: model_type={config_dict.get('model_type')!r}; "
                         f"expected model_type 'neobert'")
    neobert_config(config_dict, config_file)  # a field of the wrong kind fails naming the file
    return NeoBERTConfig.from_pretrained(str(folder))


def read_hf_folder(src: PathLike) -> Tuple[StateDict, NeoBERTConfig]:
    """Loads a NeoBERT HF folder (ours or the published one) -> (state dict with published keys, config).

    A checkpoint saved from the bare `NeoBERT` (keys without the `model.` prefix) is accepted and prefixed;
    the MLM head is then absent from the result.
    """
    src = Path(src)
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a folder")
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} has no config.json: not a Hugging Face checkpoint folder")
    config_dict = _read_json(src / "config.json")
    model_type = config_dict.get("model_type")
    architectures = config_dict.get("architectures") or []
    if model_type != "neobert" or any(not a.startswith("NeoBERT") for a in architectures):
        raise ValueError(
            f"{src / 'config.json'} describes model_type={model_type!r}, architectures={architectures}: "
            f"not a NeoBERT checkpoint"
        )
    config = neobert_config(config_dict, src / "config.json")

    if (src / WEIGHTS_NAME).is_file():
        state_dict = _load_weight_file(src / WEIGHTS_NAME)
    elif (src / WEIGHTS_INDEX_NAME).is_file():
        state_dict = _load_sharded(src, WEIGHTS_INDEX_NAME)
    elif (src / BIN_WEIGHTS_NAME).is_file():
        state_dict = _load_weight_file(src / BIN_WEIGHTS_NAME)
    elif (src / BIN_WEIGHTS_INDEX_NAME).is_file():
        state_dict = _load_sharded(src, BIN_WEIGHTS_INDEX_NAME)
    else:
        raise FileNotFoundError(
            f"{src} has no weights: looked for {WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME}, {BIN_WEIGHTS_NAME}, "
            f"{BIN_WEIGHTS_INDEX_NAME}"
        )

    if "encoder.weight" in state_dict and not any(k.startswith("model.") for k in state_dict):
        state_dict = {"model." + k: v for k, v in state_dict.items()}
    validate_hf_state_dict(state_dict, config, where=str(src))
    return state_dict, config


def checkpoint_revision(folder: PathLike, **settings) -> str:
    """16 hex digits of sha256 over the weight files, the config files, the tokenizer files and `settings`
    (dtype, instructions, ...): what names a local folder's results, which have no Hub revision."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and (
        p.suffix in WEIGHT_SUFFIXES or p.name.endswith("config.json") or p.name in TOKENIZER_FILES))
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise FileNotFoundError(f"{folder} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(folder)).encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


__all__ = [
    "AUTO_MAP",
    "checkpoint_revision",
    "expected_hf_shapes",
    "validate_hf_state_dict",
    "hf_config_dict",
    "write_hf_folder",
    "read_hf_folder",
]
