"""The line a run or a tool prints about what runs each part of a step (layers, attention, optimizer, data loader),
from the probes of `kernels.py` and the attention kernels of `model/attention.py`: above both, so that neither
imports the other's layer."""

from typing import Dict

from megatron_neobert.kernels import (PACKAGES, choose_transformer_impl, installed_version, probe,
                                      transformer_engine_available)
from megatron_neobert.model.attention import PACKED_KERNELS, packed_attention_backend


def kernel_report(transformer_impl: str = "auto", data_loader: str = "torch") -> Dict[str, str]:
    """What runs each part of a training step, in words."""
    import torch

    gpu = torch.cuda.is_available()
    if choose_transformer_impl(transformer_impl, gpu, transformer_engine_available()) == "transformer_engine":
        layers = f"Transformer Engine {probe('transformer_engine')} (fused norm+linear, fused attention)"
    else:
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
    # DALI is not imported to say it is there when the run does not use it: its version is its distribution's.
    unused = {"dali"} if data_loader != "dali" else set()
    available = {n: installed_version(n) if n in unused else probe(n) for n in PACKAGES}
    return {
        "device": torch.cuda.get_device_name() if gpu else "CPU (gloo; megatron-core CUDA calls redirected)",
        "layers": layers,
        "optimizer": adam,
        "data loader": loader,
        "available": ", ".join(f"{n}={version or 'no'}" for n, version in available.items()),
    }


def format_report(report: Dict[str, str]) -> str:
    return "kernels: " + "; ".join(f"{k}: {v}" for k, v in report.items())
