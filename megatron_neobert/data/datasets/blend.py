"""Turn ``--data-path`` tokens into megatron-core's blend: ``(prefixes, weights or None)``.

``A`` -> (["A"], None); ``0.2 A 0.4 B 0.4 C`` -> (["A", "B", "C"], [0.2, 0.4, 0.4]). Weights are
kept as given; megatron-core normalises them. Stricter than megatron-core's
``get_blend_from_list``, which lets a mix of weighted and unweighted entries through.
"""

import json
import shlex
from typing import List, Optional, Sequence, Tuple, Union


def _as_float(token: str) -> Optional[float]:
    try:
        return float(token)
    except ValueError:
        return None


def parse_data_path(data_path: Union[str, Sequence[str], None]
                    ) -> Optional[Tuple[List[str], Optional[List[float]]]]:
    if data_path is None:
        return None
    tokens = shlex.split(data_path) if isinstance(data_path, str) else [str(t) for t in data_path]
    if not tokens:
        raise ValueError("--data-path is empty")
    numbers = [_as_float(t) for t in tokens]
    if all(x is None for x in numbers):
        return tokens, None
    if len(tokens) % 2 or any(x is None for x in numbers[0::2]):
        raise ValueError(f"--data-path {' '.join(tokens)!r}: give either prefixes only or "
                         "'weight prefix' pairs (e.g. 0.2 A 0.4 B 0.4 C)")
    weights, prefixes = numbers[0::2], tokens[1::2]
    if any(w <= 0 for w in weights):
        raise ValueError(f"--data-path weights must be positive, got {weights}")
    return prefixes, weights


def blends_from_args(data_path=None, data_args_path: Optional[str] = None,
                     per_split_data_args_path: Optional[str] = None):
    """(blend, blend_per_split) from Megatron-LM's three ways to name the data: ``--data-path``;
    ``--data-args-path`` (a file holding what --data-path would, e.g. thousands of 'weight
    prefix' pairs); ``--per-split-data-args-path`` (JSON: {"train": ..., "valid": ..., "test":
    ...}, each a list or a string like --data-path's)."""
    given = [name for name, value in (("--data-path", data_path), ("--data-args-path", data_args_path),
                                      ("--per-split-data-args-path", per_split_data_args_path))
             if value is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of --data-path, --data-args-path, "
                         f"--per-split-data-args-path (got {given or 'none'}; see "
                         "tools/preprocess_data.py)")
    if data_path is not None:
        return parse_data_path(data_path), None
    if data_args_path is not None:
        with open(data_args_path, encoding="utf-8") as f:
            return parse_data_path(f.read()), None
    with open(per_split_data_args_path, encoding="utf-8") as f:
        per_split = json.load(f)
    missing = [s for s in ("train", "valid", "test") if s not in per_split]
    if missing:
        raise ValueError(f"{per_split_data_args_path} lacks {missing}: it needs train, valid and "
                         "test entries (an empty list for none)")
    return None, [parse_data_path(per_split[s]) if per_split[s] else None
                  for s in ("train", "valid", "test")]
