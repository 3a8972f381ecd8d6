"""Throughput figures for the log: FLOPs per step, TFLOP/s per GPU, MFU, memory.

FLOPs as the paper counts them: 6 x non-embedding parameters per token, plus attention
(12 x layers x hidden per query-key pair, forward and backward), plus the MLM head
(6 x hidden x vocab) on the positions where logits are computed, i.e. the masked ones. The pairs
are those attention computes usefully: L^2 per document of length L (packed documents attend
within themselves; a padded sample's real tokens among themselves), padding excluded.
Activation recomputation is not counted, as is usual for MFU.
"""

from typing import Dict, Optional

import psutil
import torch

from megatron_neobert.model import NeoBERTArch

# Dense (no sparsity) peak TFLOP/s per GPU, (bf16, fp8), from NVIDIA's datasheets, by the exact name
# torch.cuda.get_device_name() gives: an H100 PCIe or NVL is slower than the SXM part ("80GB HBM3"), so a
# substring would overstate their MFU. A100 has no FP8.
PEAK_TFLOPS = {
    "NVIDIA H100 80GB HBM3": (989.0, 1979.0),
    "NVIDIA H100 PCIe": (756.0, 1513.0),
    "NVIDIA H100 NVL": (835.5, 1670.5),
    "NVIDIA H200": (989.0, 1979.0),
    "NVIDIA H200 NVL": (835.5, 1670.5),
    "NVIDIA A100-SXM4-80GB": (312.0, None),
    "NVIDIA A100-SXM4-40GB": (312.0, None),
    "NVIDIA A100-PCIE-40GB": (312.0, None),
    "NVIDIA A100 80GB PCIe": (312.0, None),
}


def non_embedding_params(arch: NeoBERTArch) -> int:
    h, f = arch.hidden_size, arch.ffn_hidden_size
    bias = arch.add_bias_linear
    attn = 4 * h * h + (4 * h if bias else 0)
    mlp_in = (2 if arch.activation == "swiglu" else 1) * f
    mlp = h * mlp_in + f * h + ((mlp_in + h) if bias else 0)
    norms = 2 * h * (2 if arch.normalization == "LayerNorm" else 1)
    return arch.num_layers * (attn + mlp + norms)


def step_flops(arch: NeoBERTArch, num_tokens: int, num_predicted: int, attended_pairs: int,
               vocab_size: int) -> float:
    """Training FLOPs (forward + backward) of a step over `num_tokens` tokens, of which
    `num_predicted` go through the MLM head, and whose documents hold `attended_pairs` query-key
    pairs (see `attended_pairs`; one sequence of length s: s^2)."""
    return float(num_tokens * 6 * non_embedding_params(arch)
                 + attended_pairs * 12 * arch.num_layers * arch.hidden_size
                 + num_predicted * 6 * arch.hidden_size * vocab_size)


def attended_pairs(batch: Dict[str, torch.Tensor], pad_id: int) -> torch.Tensor:
    """Sum over the documents of a collated micro-batch of their length squared, as a 0-d int64
    tensor on the batch's device: packed, each piece of `cu_seqlens` but the padding pieces (which
    start with padding; documents start with [CLS]); padded, each sample's real tokens."""
    if "cu_seqlens" not in batch:
        return (batch["attention_mask"].sum(dim=1, dtype=torch.int64) ** 2).sum()
    cu = batch["cu_seqlens"].to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    real = batch["tokens"].reshape(-1)[cu[:-1]] != pad_id
    return (lengths ** 2 * real).sum()


def peak_tflops(fp8: bool) -> Optional[float]:
    """This GPU's dense peak for the precision in use, or None (CPU, a GPU not named in PEAK_TFLOPS):
    no MFU rather than one against another part's peak."""
    if not torch.cuda.is_available():
        return None
    bf16, f8 = PEAK_TFLOPS.get(torch.cuda.get_device_name(), (None, None))
    return f8 if fp8 else bf16


def memory_gib() -> float:
    """Peak GPU memory allocated by this rank, or the process's resident memory on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return psutil.Process().memory_info().rss / 2**30


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    d, rem = divmod(seconds, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return (f"{d}d " if d else "") + f"{h:02d}:{m:02d}:{s:02d}"
