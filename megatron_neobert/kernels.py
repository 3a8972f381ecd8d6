"""Which optional kernels this process can use, probed lazily, and the ones a run will use.

Transformer Engine, flash-attn, apex and DALI come with NVIDIA's PyTorch containers; each is
optional and each has a PyTorch fallback. A probe imports the package once, the first time it is
asked (importing TE or flash-attn takes seconds and may fail on a mismatched build, which counts
as "not available"), and never raises.

A half-installed Transformer Engine (the meta package without its PyTorch extension, versions
that differ, a CUDA library missing) raises AssertionError, FileNotFoundError or ImportError on
import, which megatron-core's guards let through: `import megatron.core` itself fails, deep in a
traceback. The entry points import megatron-core through `import_megatron_core`, which checks TE first and
says what is wrong in one line. Kept free of a top-level torch import: the tools' --help reads it.
"""

import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import warnings
from functools import lru_cache, partial, wraps
from pathlib import Path
from typing import Optional

PACKAGES = {
    # With megatron-core's wrappers of it: TE is usable only when both import.
    "transformer_engine": ("transformer_engine", "megatron.core.extensions.transformer_engine"),
    "flash_attn": "flash_attn",
    "apex": "apex",
    "dali": "nvidia.dali",
}
# How the distributions of a package whose version is read without importing it are named, as their dist-info
# folders begin (DALI's: nvidia-dali-cuda120, -cuda130, ...).
DIST_INFO_PREFIXES = {"dali": "nvidia_dali"}


@lru_cache(maxsize=None)
def probe(name: str) -> Optional[str]:
    """The version of an optional package if it imports, else None."""
    modules = PACKAGES[name] if isinstance(PACKAGES[name], tuple) else (PACKAGES[name],)
    try:
        module = [importlib.import_module(m) for m in modules][0]
    except Exception:  # ImportError, or a build that does not match this torch/CUDA
        return None
    return str(getattr(module, "__version__", "unknown version"))


def installed_version(name: str) -> Optional[str]:
    """The version of an optional package in DIST_INFO_PREFIXES as its installed distribution says, without importing
    it (DALI's import takes a second of every rank's start-up), or None when it is not installed; the import's answer
    (`probe`) where no distribution names it."""
    try:
        spec = importlib.util.find_spec(PACKAGES[name])
    except ModuleNotFoundError:  # its namespace package (nvidia) is not there either
        return None
    if spec is None or spec.origin is None:
        return None
    site_packages = Path(spec.origin).parents[PACKAGES[name].count(".") + 1]
    for dist_info in sorted(site_packages.glob(f"{DIST_INFO_PREFIXES[name]}*.dist-info")):
        return importlib.metadata.Distribution.at(dist_info).version
    return probe(name)


def transformer_engine_available() -> bool:
    return probe("transformer_engine") is not None


def choose_transformer_impl(requested: str, on_gpu: bool, te_available: bool) -> str:
    """The layers a model is built with: "transformer_engine" or "local". `requested`: --transformer-impl (auto:
    Transformer Engine when it imports on a GPU). The one place that decides it."""
    if requested not in ("auto", "transformer_engine", "local"):
        raise ValueError(f"--transformer-impl must be auto, transformer_engine or local, not {requested!r}")
    if requested == "transformer_engine" and not te_available:
        raise ValueError("--transformer-impl transformer_engine: Transformer Engine does not import here")
    if requested == "auto":
        return "transformer_engine" if te_available and on_gpu else "local"
    return requested


def transformer_engine_install_problem() -> Optional[str]:
    """One line saying why an installed Transformer Engine breaks megatron-core's import, else None: TE
    absent, loading, or its top level failing with the ModuleNotFoundError that megatron-core's guards take
    as "not installed". Once `transformer_engine` imports, megatron-core's fp8_utils imports
    `transformer_engine.pytorch` unguarded, so any error of that one breaks megatron-core."""
    if importlib.util.find_spec("transformer_engine") is None:
        return None
    try:
        importlib.import_module("transformer_engine")
    except ModuleNotFoundError:
        return None
    except Exception as err:
        return _install_problem(err)
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as err:
        return _install_problem(err)
    return None


def _install_problem(err: Exception) -> str:
    detail = (str(err).strip().splitlines() or [""])[0]
    return (f"Transformer Engine is installed but does not load ({type(err).__name__}: {detail}), so "
            "megatron-core cannot be imported: install transformer-engine, transformer-engine-cu13 and "
            "transformer-engine-torch of one version, the last built against this torch (docs/gpu.md), "
            "or uninstall transformer-engine to use the PyTorch layers")


class TransformerEngineInstallError(RuntimeError):
    pass


# What megatron-core's import warns about each missing GPU extension: the kernel report says once what runs.
_IMPORT_WARNINGS = (".*Transformer Engine and Apex are not installed.*", ".*Apex is not installed.*",
                    ".*full scope is deprecated.*")
# The same, as the interpreter's start-up filters (PYTHONWARNINGS: a message's beginning) for processes that import
# megatron-core before any code of ours runs in them (spawned ranks unpickling their function).
_IMPORT_WARNING_STARTS = ("Transformer Engine and Apex are not installed", "Apex is not installed")


def quiet_import_warnings_option() -> str:
    """PYTHONWARNINGS for a child process: the caller's own, and megatron-core's import warnings ignored."""
    own = os.environ.get("PYTHONWARNINGS")
    return ",".join(([own] if own else []) + [f"ignore:{start}" for start in _IMPORT_WARNING_STARTS])


def import_megatron_core() -> None:
    """Import megatron-core, for an entry point (the trainer, a tool) before it reaches code that needs it: a
    half-installed Transformer Engine is named in one line (TransformerEngineInstallError) instead of failing deep in
    megatron-core's import, whose warnings about missing extensions are silenced for the import alone."""
    if "megatron.core" in sys.modules:
        return
    problem = transformer_engine_install_problem()
    if problem:
        raise TransformerEngineInstallError(problem)
    from megatron_neobert.megatron_core_compat import IMPORT_WARNINGS, QUIET_IMPORTS

    # The import also logs at INFO which Megatron-FSDP flavour it would use without TE: not what a run uses. Its
    # tensor-parallel RNG imports torch's C++ extension builder, which warns on a CUDA build of torch without a CUDA
    # runtime (a node without GPUs) that it would build against /usr/local: nothing of ours builds an extension.
    disabled = logging.root.manager.disable
    logging.disable(max(disabled, logging.INFO))
    extension_builder = logging.getLogger("torch.utils.cpp_extension")
    extension_builder.addFilter(_no_cuda_runtime_dropped)
    try:
        with warnings.catch_warnings(), compiled_on_first_call(), left_out("wandb"):
            for message in _IMPORT_WARNINGS + IMPORT_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            # backends: the layer specs' norms, warning at import when apex is absent
            for module in ("megatron.core", "megatron.core.models.backends", *QUIET_IMPORTS):
                importlib.import_module(module)
    finally:
        logging.disable(disabled)
        extension_builder.removeFilter(_no_cuda_runtime_dropped)


@contextlib.contextmanager
def compiled_on_first_call():
    """Inside the block, `torch.compile(function)` compiles at the function's first call instead of at once.

    megatron-core decorates its fused kernels with torch.compile as it is imported (`megatron.core.jit.jit_fuser`),
    and that decoration alone imports dynamo and inductor: 2-3.5 s of every rank's and tool's start on 2 cores, for
    kernels that a CPU rank or a conversion never calls. torch.compile only traces at the first call anyway, so the
    deferred function compiles the same graph at the same moment. Modules (not functions) are compiled at once.
    """
    import torch

    compile_now = torch.compile

    def compile_later(model=None, **options):
        if model is None:  # torch.compile(mode=...) as a decorator factory
            return partial(compile_later, **options)
        if not callable(model) or isinstance(model, torch.nn.Module):
            return compile_now(model, **options)
        compiled = None

        @wraps(model)
        def first_call_compiles(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = compile_now(model, **options)
            return compiled(*args, **kwargs)

        return first_call_compiles

    torch.compile = compile_later
    try:
        yield
    finally:
        torch.compile = compile_now


@contextlib.contextmanager
def left_out(name: str):
    """Inside the block, `import name` raises ImportError unless it was imported before; after it, it imports.

    megatron-core imports wandb at import (`try: import wandb`) for logging of its own that a run does not use: its
    timers' writer, its inference engine's, its MoE and multi-token-prediction metrics. The trainer logs to wandb
    through its own writer (--wandb-project), which imports it then. Left out, those modules hold `wandb = None`,
    and every rank and tool starts 0.6-0.7 s sooner (wandb's import: protobuf, its settings)."""
    if name in sys.modules:
        yield
        return
    sys.modules[name] = None
    try:
        yield
    finally:
        if sys.modules.get(name, ...) is None:
            del sys.modules[name]


def _no_cuda_runtime_dropped(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("No CUDA runtime is found")
