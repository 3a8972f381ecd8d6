"""Which optional kernels this process can use, probed lazily, and the ones a run will use.

Transformer Engine, flash-attn, apex and DALI come with NVIDIA's PyTorch containers; each is
optional and each has a PyTorch fallback. A probe imports the package once, the first time it is
asked (importing TE or flash-attn takes seconds and may fail on a mismatched build, which counts
as "not available"), and never raises.
"""

import importlib
from functools import lru_cache
from typing import Dict, Optional

import torch

_PACKAGES = {
    "transformer_engine": "transformer_engine",
    "flash_attn": "flash_attn",
    "apex": "apex",
    "dali": "nvidia.dali",
}


@lru_cache(maxsize=None)
def probe(name: str) -> Optional[str]:
    """The version of an optional package if it imports, else None."""
    try:
        module = importlib.import_module(_PACKAGES[name])
    except Exception:  # ImportError, or a build that does not match this torch/CUDA
        return None
    return str(getattr(module, "__version__", "unknown version"))


def kernel_report(transformer_impl: str = "auto", data_loader: str = "torch") -> Dict[str, str]:
    """What runs each part of a training step, in words."""
    from megatron_neobert.model.layer_specs import use_transformer_engine

    te = use_transformer_engine(transformer_impl, log=False)  # the choice the model's layer spec makes
    gpu = torch.cuda.is_available()
    if te:
        layers = f"Transformer Engine {probe('transformer_engine')} (fused norm+linear, fused attention)"
    else:
        from megatron_neobert.model.attention import PACKED_KERNELS, packed_attention_backend

        packed = packed_attention_backend(gpu)  # as for bf16 without attention dropout, the defaults
        layers = (f"megatron-core local layers; packed attention: {PACKED_KERNELS[packed]}"
                  + (f" {probe('flash_attn')}" if packed == "flash" else "")
                  + "; padded attention: PyTorch SDPA; PyTorch norms")
    # megatron-core's optimizer picks TE's FusedAdam, else apex's, else torch.optim.AdamW.
    if probe("transformer_engine"):
        adam = "Transformer Engine FusedAdam"
    elif probe("apex"):
        adam = f"apex FusedAdam ({probe('apex')})"
    else:
        adam = "torch.optim.AdamW"
    if data_loader == "dali":
        loader = (f"DALI {probe('dali')}" if probe("dali")
                  else "DALI requested but nvidia.dali does not import")
    else:
        loader = "torch DataLoader"
    return {
        "device": torch.cuda.get_device_name() if gpu else "CPU (gloo; megatron-core CUDA calls redirected)",
        "layers": layers,
        "optimizer": adam,
        "data loader": loader,
        "available": ", ".join(f"{n}={probe(n) or 'no'}" for n in _PACKAGES),
    }


def format_report(report: Dict[str, str]) -> str:
    return "kernels: " + "; ".join(f"{k}: {v}" for k, v in report.items())
