"""The package's optional dependencies, by setup.py's extra, and the one line that names the install a command
lacks: a user reads which extra to install instead of a ModuleNotFoundError (tests/test_extras.py ties the
declaration to setup.py and runs each command without its extra)."""

import importlib.util
from typing import Optional, Sequence

from megatron_neobert.errors import InputError

# extra -> {distribution (as setup.py requires it): the module it installs}; nothing heavy is imported here, so a
# command checks its extra before its first import of one.
EXTRAS = {
    "eval": {"scipy": "scipy", "scikit-learn": "sklearn", "datasets": "datasets",
             "sentence-transformers": "sentence_transformers", "mteb>=2": "mteb"},
    "data": {"nltk": "nltk"},
    "wandb": {"wandb": "wandb"},
}


class MissingExtra(InputError):
    """An optional dependency a command or flag needs is not installed: one line naming the extra to install."""


def require_extra(extra: str, needer: str, modules: Optional[Sequence[str]] = None) -> None:
    """Raise `MissingExtra` when `extra`'s `modules` (default: all of them), which `needer` (a command, a flag or an
    input) imports, are not all installed, naming those missing and the install that brings them."""
    distribution = {module: name.split(">")[0] for name, module in EXTRAS[extra].items()}
    absent = [distribution[m] for m in modules or distribution if importlib.util.find_spec(m) is None]
    if absent:
        raise MissingExtra(f"{needer} needs {', '.join(absent)}, not installed: install the package's {extra} extra "
                           f"(pip install \".[{extra}]\" in the megatron_neobert checkout)")
