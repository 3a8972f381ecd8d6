"""Turn ``--data-path`` tokens into megatron-core's blend: ``(prefixes, weights or None)``.

``A`` -> (["A"], None); ``0.2 A 0.4 B 0.4 C`` -> (["A", "B", "C"], [0.2, 0.4, 0.4]). Weights are
kept as given; megatron-core normalises them. Stricter than megatron-core's
``get_blend_from_list``, which lets a mix of weighted and unweighted entries through.
"""

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
