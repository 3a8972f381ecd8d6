"""Where a model or tokenizer comes from: a local folder or a Hugging Face Hub name, checked before any work.

Every tool that reads a Hugging Face folder (GLUE, pseudo-perplexity, MTEB, contrastive and CDE fine-tuning,
conversion) asks `check_model_source` first, so that a mistyped folder is one line naming it, not a grid of
failed runs or transformers' "Repo id must be in the form ..." deep in a load.
"""

import difflib
import os
from typing import Optional

from megatron_neobert.checkpoint.layout import LATEST_MARKER


def check_hub_reachable(name: str) -> None:
    """A name that is neither a local folder nor in the Hugging Face cache is downloaded: without
    the Hub, fail at once (transformers retries for about a minute before it gives up)."""
    import socket
    from urllib.parse import urlsplit
    from urllib.request import getproxies

    import huggingface_hub
    from huggingface_hub import constants

    if os.path.isdir(name) or os.path.isdir(os.path.join(constants.HF_HUB_CACHE, "models--" + name.replace("/", "--"))):
        return
    where = f"no folder {name} in {os.getcwd()}, nor in the Hugging Face cache {constants.HF_HUB_CACHE}"
    if huggingface_hub.is_offline_mode():
        raise OSError(f"{where}, and HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE forbid downloading it")
    endpoint = urlsplit(constants.ENDPOINT)
    if getproxies().get(endpoint.scheme) or getproxies().get("all"):
        return  # reached through a proxy: only the download can tell
    try:
        port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
        socket.create_connection((endpoint.hostname, port), timeout=5).close()
    except OSError as err:
        raise OSError(f"{where}, and the Hub ({constants.ENDPOINT}) cannot be reached: {err}") from err


def _is_hub_name(name: str) -> bool:
    """`owner/name` or `name` as the Hub spells repositories, and not a path into a local folder: `runs/hff`
    is a path when `runs` is a folder here."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return not ("/" in name and os.path.isdir(name.split("/", 1)[0]))


def _near_miss(path: str) -> Optional[str]:
    """The sibling folder `path` was probably meant to name (`runs/hff` for `runs/hf`), if one is close."""
    parent, base = os.path.split(os.path.normpath(path))
    try:
        siblings = [n for n in os.listdir(parent or ".") if os.path.isdir(os.path.join(parent or ".", n))]
    except OSError:
        return None
    close = difflib.get_close_matches(base, siblings, n=1, cutoff=0.6)
    return os.path.join(parent, close[0]) if close else None


def folder_listing(path: str, limit: int = 5) -> str:
    """The first names in a folder, for an error that says what it found: "a, b, c, ... (9 entries)"."""
    names = sorted(os.listdir(path))
    shown = ", ".join(names[:limit]) + (f", ... ({len(names)} entries)" if len(names) > limit else "")
    return shown or "nothing"


def _not_a_model_folder(path: str) -> str:
    """What a folder without config.json holds, said the way that leads to the right folder."""
    names = os.listdir(path)
    if LATEST_MARKER in names or any(n.startswith("iter_") for n in names) or "metadata.json" in names:
        return (f"a trainer checkpoint, not a Hugging Face model folder: export it first with "
                f"neobert-convert-checkpoint --direction mcore-to-hf --load {path} --save HF_FOLDER")
    return f"no config.json, so not a Hugging Face model folder (it holds: {folder_listing(path)})"


def check_model_source(name, flag: str = "--model", hub: bool = True) -> None:
    """A local Hugging Face model folder (one with config.json), or with `hub` a Hub name that is cached or can
    be downloaded; anything else is a ValueError in one line naming `flag`, what is at that path and, for a
    mistyped folder, the sibling it probably meant."""
    name = str(name)
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise ValueError(f"{flag} {name}: {_not_a_model_folder(name)}")
        return
    if os.path.exists(name):
        raise ValueError(f"{flag} {name} is a file, not a model folder")
    guess = _near_miss(name)
    if hub and _is_hub_name(name):
        try:
            check_hub_reachable(name)
            return
        except OSError as err:
            if not guess:  # a Hub name that cannot be had; with a folder close to it, a mistyped folder
                raise ValueError(f"{flag} {name}: {err}") from None
    raise ValueError(f"{flag} {name}: no such folder" + (f" (did you mean {guess}?)" if guess else ""))
