"""Throughput of NeoBERT against its baselines, measured side by side in one process.

- Inference: tokens/s against sequence length with the largest batch that fits (up to 512), as
  the paper's table 10, for our HF model, the megatron-core model, and transformers' own
  ModernBERT-base and BERT-base built from their configs with random weights.
- Training: real (non-pad) tokens/s, TFLOP/s and MFU of the megatron-core training step, packed
  and padded (and FP8 when Transformer Engine runs), against a reference baseline trained the way
  the released NeoBERT trains: HF model, padded batches, AdamW, bf16 autocast, PyTorch SDPA, the
  MLM head on every position. Every figure is also printed as a ratio to its baseline.
"""

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from megatron_neobert.model import NeoBERTArch

PEAK_TFLOPS = {"bf16": 989.0, "fp8": 1979.0}  # H100/H200 SXM dense (spec section 5)


@dataclass
class Measurement:
    benchmark: str  # "inference" | "training"
    model: str
    seq_length: int
    batch_size: int
    tokens_per_s: float
    peak_memory_gib: float = 0.0
    tflops_per_gpu: Optional[float] = None
    mfu: Optional[float] = None
    ratio_to_baseline: Optional[float] = None


def training_flops_per_token(arch: NeoBERTArch, seq_length: int, mask_rate: float,
                             head_on_all_positions: bool = False) -> float:
    """6 x non-embedding parameters + attention (12 x layers x hidden x seq) + the MLM head on
    the positions where logits are computed (spec section 5)."""
    h, f = arch.hidden_size, arch.ffn_hidden_size
    mlp = (3 if arch.activation == "swiglu" else 2) * h * f
    non_embedding = arch.num_layers * (4 * h * h + mlp)
    head_share = 1.0 if head_on_all_positions else mask_rate
    return 6 * non_embedding + 12 * arch.num_layers * h * seq_length + 6 * h * arch.vocab_size * head_share


def document_lengths(seq_length: int, count: int, seed: int = 0) -> List[int]:
    """Web-like document lengths (log-normal, median about seq/3), clipped to [8, seq]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.exp(torch.randn(count, generator=g) * 0.9 + math.log(seq_length / 3))
    return lengths.clamp(8, seq_length).long().tolist()


def mlm_batch(lengths: List[int], seq_length: int, vocab_size: int, packed: bool, mask_rate: float,
              seed: int = 0) -> Dict[str, torch.Tensor]:
    """A synthetic MLM batch in the data loader's layout (padded rows, or the same documents
    packed end to end into full rows with cu_seqlens)."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    tokens = torch.randint(5, vocab_size, (b, seq_length), generator=g)
    if packed:
        cuts, total = [0], 0
        while total < b * seq_length:  # fill b full rows, documents never crossing a row
            row_left = seq_length - total % seq_length
            total += min(lengths[len(cuts) % len(lengths)], row_left)
            cuts.append(total)
        real = torch.ones(b, seq_length, dtype=torch.bool)
        extra = dict(cu_seqlens=torch.tensor(cuts, dtype=torch.int32),
                     max_seqlen=int(max(c1 - c0 for c0, c1 in zip(cuts, cuts[1:]))))
    else:
        real = torch.arange(seq_length)[None, :] < torch.tensor(lengths)[:, None]
        extra = dict(attention_mask=real)
    selected = (torch.rand(b, seq_length, generator=g) < mask_rate) & real
    labels = torch.where(selected, tokens, torch.full_like(tokens, -100))
    return dict(tokens=torch.where(selected, torch.full_like(tokens, 4), tokens), labels=labels, **extra)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_per_step(step: Callable[[], None], steps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        step()
    _sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync()
    return (time.perf_counter() - start) / steps


def _peak_memory_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def _largest_batch(run: Callable[[int], float], max_batch: int) -> tuple:
    """(batch, seconds per step) for the largest power-of-two batch up to max_batch that fits."""
    batch = max_batch
    while batch >= 1:
        try:
            return batch, run(batch)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            batch //= 2
    raise RuntimeError("not even a batch of 1 fits in memory")


def inference_encoders(arch: NeoBERTArch, baselines: bool, small: bool, device, dtype) -> Dict[str, Callable]:
    """name -> encode(input_ids, attention_mask) for each model compared."""
    import transformers

    from megatron_neobert.conversion.hf_format import neobert_config_from_dims
    from megatron_neobert.conversion.modeling_neobert import NeoBERT

    cfg = neobert_config_from_dims(arch.num_layers, arch.hidden_size, arch.num_attention_heads,
                                   arch.ffn_hidden_size, arch.vocab_size, arch.max_sequence_length,
                                   arch.norm_epsilon, float(arch.rotary_base))
    models = {"neobert-hf": NeoBERT(cfg)}
    if baselines:
        shrink = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128) if small else {}
        models["modernbert-base"] = transformers.AutoModel.from_config(
            transformers.ModernBertConfig(**shrink), attn_implementation="sdpa")
        models["bert-base"] = transformers.AutoModel.from_config(
            transformers.BertConfig(max_position_embeddings=8192, **shrink), attn_implementation="sdpa")
    encoders = {}
    for name, model in models.items():
        model = model.to(device=device, dtype=dtype).eval()
        encoders[name] = (lambda m: lambda ids, mask: m(input_ids=ids, attention_mask=mask))(model)
    encoders["neobert-megatron"] = _megatron_encoder(arch, device, dtype)
    return encoders


def _megatron_encoder(arch: NeoBERTArch, device, dtype) -> Callable:
    from megatron_neobert.model import build_model, transformer_config
    from megatron_neobert.parallel.launch import initialize_model_parallel

    initialize_model_parallel(1, 1)
    config = transformer_config(arch, bf16=dtype == torch.bfloat16, params_dtype=dtype)
    model = build_model(arch, config).to(device=device, dtype=dtype).eval()
    return lambda ids, mask: model(ids, attention_mask=mask, return_hidden_states=True)


def benchmark_inference(arch: NeoBERTArch, seq_lengths: List[int], steps: int, max_batch: int,
                        baselines: bool = True, small: bool = False) -> List[Measurement]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    encoders = inference_encoders(arch, baselines, small, device, dtype)
    results = []
    for seq in seq_lengths:
        for name, encode in encoders.items():
            def run(batch, encode=encode, seq=seq):
                ids = torch.randint(5, 1000, (batch, seq), device=device)
                mask = torch.ones(batch, seq, dtype=torch.bool, device=device)
                with torch.inference_mode():
                    return time_per_step(lambda: encode(ids, mask), steps)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            batch, seconds = _largest_batch(run, max_batch)
            results.append(Measurement("inference", name, seq, batch, batch * seq / seconds, _peak_memory_gib()))
    _ratios(results, baseline="modernbert-base" if baselines else "neobert-hf")
    return results


def _reference_train_step(arch: NeoBERTArch, batch: dict, device) -> Callable:
    """The released NeoBERT's way: HF model, padded, AdamW, bf16 autocast, head on every token."""
    from megatron_neobert.conversion.hf_format import neobert_config_from_dims
    from megatron_neobert.conversion.modeling_neobert import NeoBERTLMHead

    cfg = neobert_config_from_dims(arch.num_layers, arch.hidden_size, arch.num_attention_heads,
                                   arch.ffn_hidden_size, arch.vocab_size, arch.max_sequence_length)
    model = NeoBERTLMHead(cfg).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    inputs = {k: batch[k].to(device) for k in ("tokens", "labels", "attention_mask")}

    def step():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=inputs["tokens"], attention_mask=inputs["attention_mask"],
                         labels=inputs["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _megatron_train_step(arch: NeoBERTArch, batch: dict, fp8: bool) -> Callable:
    """One step of the trainer's machinery: megatron-core DDP, its optimizer, its schedule."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from megatron_neobert.model import transformer_config
    from megatron_neobert.parallel.launch import initialize_model_parallel
    from megatron_neobert.training.model_setup import build_model_chunks
    from megatron_neobert.training.step import micro_batch_tensor_shape, mlm_forward_step

    initialize_model_parallel(1, 1)
    bf16 = torch.cuda.is_available()
    extra = dict(fp8="hybrid", fp8_recipe="delayed") if fp8 else {}
    config = transformer_config(arch, bf16=bf16, params_dtype=torch.bfloat16 if bf16 else torch.float32,
                                pipeline_dtype=torch.bfloat16 if bf16 else torch.float32, **extra)
    chunks = build_model_chunks(arch, config, "transformer_engine" if fp8 else "auto",
                                DistributedDataParallelConfig(grad_reduce_in_fp32=True))
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, bf16=bf16,
                                                       clip_grad=1.0, weight_decay=0.1), chunks)
    seq_length, mbs = micro_batch_tensor_shape(batch)
    schedule = get_forward_backward_func()

    def step():
        chunks[0].zero_grad_buffer()
        optimizer.zero_grad()
        schedule(forward_step_func=mlm_forward_step, data_iterator=iter([batch]), model=chunks,
                 num_microbatches=1, seq_length=seq_length, micro_batch_size=mbs, forward_only=False)
        optimizer.step()
    return step


def benchmark_training(arch: NeoBERTArch, seq_length: int, micro_batch: int, steps: int,
                       mask_rate: float = 0.2, fp8: bool = False) -> List[Measurement]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lengths = document_lengths(seq_length, micro_batch)
    padded = mlm_batch(lengths, seq_length, arch.vocab_size, packed=False, mask_rate=mask_rate)
    packed = mlm_batch(lengths, seq_length, arch.vocab_size, packed=True, mask_rate=mask_rate)
    runs = [("reference-hf-padded", padded, lambda: _reference_train_step(arch, padded, device), True),
            ("megatron-padded", padded, lambda: _megatron_train_step(arch, padded, False), False),
            ("megatron-packed", packed, lambda: _megatron_train_step(arch, packed, False), False)]
    if fp8:
        runs.append(("megatron-packed-fp8", packed, lambda: _megatron_train_step(arch, packed, True), False))
    results = []
    for name, batch, make_step, head_everywhere in runs:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds = time_per_step(make_step(), steps)
        real_tokens = int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["tokens"].numel()
        tokens_per_s = real_tokens / seconds
        tflops = tokens_per_s * training_flops_per_token(arch, seq_length, mask_rate, head_everywhere) / 1e12
        peak = PEAK_TFLOPS["fp8" if name.endswith("fp8") else "bf16"]
        results.append(Measurement("training", name, seq_length, micro_batch, tokens_per_s, _peak_memory_gib(),
                                   tflops, tflops / peak if device.type == "cuda" else None))
    _ratios(results, baseline="reference-hf-padded")
    return results


def _ratios(results: List[Measurement], baseline: str) -> None:
    base = {r.seq_length: r.tokens_per_s for r in results if r.model == baseline}
    for r in results:
        if r.seq_length in base:
            r.ratio_to_baseline = r.tokens_per_s / base[r.seq_length]


def format_table(results: List[Measurement]) -> str:
    lines = [f"{'benchmark':<10} {'model':<22} {'seq':>6} {'batch':>6} {'tokens/s':>12} {'x base':>7} "
             f"{'TFLOP/s':>8} {'MFU':>6} {'mem GiB':>8}"]
    for r in results:
        mfu = f"{100 * r.mfu:5.1f}%" if r.mfu is not None else "   n/a"
        tf = f"{r.tflops_per_gpu:8.1f}" if r.tflops_per_gpu is not None else "       -"
        ratio = f"{r.ratio_to_baseline:6.2f}x" if r.ratio_to_baseline is not None else "      -"
        lines.append(f"{r.benchmark:<10} {r.model:<22} {r.seq_length:>6} {r.batch_size:>6} "
                     f"{r.tokens_per_s:>12,.0f} {ratio} {tf} {mfu} {r.peak_memory_gib:>8.1f}")
    return "\n".join(lines)


def write_json(results: List[Measurement], path: str, meta: dict) -> None:
    import os

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "results": [dataclasses.asdict(r) for r in results]}, f, indent=2)
    os.replace(tmp, path)


def plot(results: List[Measurement], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    inference = [r for r in results if r.benchmark == "inference"]
    for model in dict.fromkeys(r.model for r in inference):
        rows = [r for r in inference if r.model == model]
        axes[0].plot([r.seq_length for r in rows], [r.tokens_per_s / 1e3 for r in rows], marker="o", label=model)
    axes[0].set(xscale="log", xlabel="sequence length", ylabel="10^3 tokens/s", title="Inference")
    axes[0].legend()
    training = [r for r in results if r.benchmark == "training"]
    axes[1].bar([f"{r.model}\n@{r.seq_length}" for r in training], [r.tokens_per_s / 1e3 for r in training])
    axes[1].set(ylabel="10^3 real tokens/s", title="Training step")
    axes[1].tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
