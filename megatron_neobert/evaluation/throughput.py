"""Throughput of NeoBERT against its baselines, measured side by side in one process.

- Inference: tokens/s against sequence length with the largest batch that fits (up to 512), as
  the paper's table 10, for our HF model, the megatron-core model, and transformers' own
  ModernBERT-base and BERT-base built from their configs with random weights.
- Training: real (non-pad) tokens/s, TFLOP/s and MFU of the trainer's own step (its set-up and its
  `train_step`: megatron-core's schedule over the micro-batches, finiteness checks, optimizer, schedule), packed
  and padded (and FP8 when Transformer Engine runs), against a reference baseline trained the way the
  released NeoBERT trains: HF model, padded batches, AdamW, bf16 autocast, PyTorch SDPA, the MLM
  head on every position, the same micro-batches. Every figure is also a ratio to its baseline.
- With `compile`, torch.compile'd variants run beside their eager models (ratio "x eager").
"""

import dataclasses
import gc
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from megatron_neobert.atomic_write import atomic_path
from megatron_neobert.data.datasets.batches import masked_position_list
from megatron_neobert.model import ModelShape, NeoBERTArch, padded_vocab_size
from megatron_neobert.training.reporting.metrics import attended_pairs, peak_tflops, step_flops

logger = logging.getLogger(__name__)

# A compiled model compiles on its first call and may recompile on the next (guards on state the
# first call set); its timing starts after those.
WARMUP_STEPS = {False: 2, True: 4}


@dataclass
class Measurement:
    benchmark: str  # "inference" | "training"
    model: str  # without the variant: "neobert-hf", "megatron-packed", ...
    seq_length: int
    batch_size: int  # sequences per micro-batch
    tokens_per_s: float  # real (non-pad) tokens; 0 when the run failed
    precision: str = "bf16"  # "bf16" | "fp8" | "fp32" (CPU)
    compiled: bool = False
    micro_batches: int = 1  # per training step
    peak_memory_gib: Optional[float] = None  # GPU only
    tflops_per_gpu: Optional[float] = None
    # Against the GPU's peak for the row's precision. FP8 rows run only the layers' linears in FP8 (attention, the
    # head and the norms stay bf16), so their MFU against the FP8 peak understates and mfu_of_bf16_peak overstates.
    mfu: Optional[float] = None
    mfu_of_bf16_peak: Optional[float] = None  # FP8 rows only
    ratio_to_baseline: Optional[float] = None
    ratio_to_eager: Optional[float] = None  # compiled variant / the same model eager
    # The trainer's rows: the loss of every step, warm-up included. Each row builds its model from the same seed
    # and repeats the same micro-batches, so the FP8 row's losses compare step by step with its bf16 row's.
    losses: Optional[List[float]] = None
    error: Optional[str] = None  # why a run gave no figure: "out of memory", "failed: ...", "not run: ..."

    @property
    def label(self) -> str:
        return self.model + ("-fp8" if self.precision == "fp8" else "") + ("+compile" if self.compiled else "")


# FP8 is compared with bf16 from this step (1-based) on. Transformer Engine's delayed scaling, as megatron-core sets it
# up (TEDelayedScaling with TransformerConfig's fp8_amax_history_len 1, fp8_amax_compute_algo "most_recent"), starts
# every scale at 1 (DelayedScalingRecipeState: torch.ones) with a zero amax history, and sets the forward scales from
# the amaxes when the first forward's outermost fp8_autocast exits (FP8GlobalStateManager.autocast_exit), the backward
# ones when the first backward's last FP8 GEMM is done (reduce_and_update_fp8_tensors(forward=False)). So step 1's first
# micro-batch casts at scale 1 (E4M3 then flushes |x| < 2^-9 to zero: the smallest weights of a std-0.02 init; E5M2
# gradients below 2^-16), and step 2's loss comes from the update those casts made.
FP8_COMPARED_FROM_STEP = 3


def fp8_loss_gap(fp8: List[float], bf16: List[float]) -> Optional[float]:
    """The largest relative difference between an FP8 run's losses and bf16's, step by step from
    FP8_COMPARED_FROM_STEP; None unless both recorded the same number of steps, that one included."""
    if not fp8 or not bf16 or len(fp8) != len(bf16) or len(fp8) < FP8_COMPARED_FROM_STEP:
        return None
    start = FP8_COMPARED_FROM_STEP - 1
    return max(abs(a - b) / abs(b) for a, b in zip(fp8[start:], bf16[start:]))


def document_lengths(seq_length: int, count: int, seed: int = 0) -> List[int]:
    """Web-like document lengths (log-normal, median about seq/3), clipped to [8, seq]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.exp(torch.randn(count, generator=g) * 0.9 + math.log(seq_length / 3))
    return lengths.clamp(8, seq_length).long().tolist()


SYNTHETIC_PAD_ID = 0  # the padding id of mlm_batch's vocabulary, whose tokens are >= 5


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
    positions, num_masked = masked_position_list(labels, mask_rate)  # as the loader's list
    return dict(tokens=torch.where(selected, torch.full_like(tokens, 4), tokens), labels=labels,
                masked_positions=positions, num_masked=num_masked, **extra)


def mlm_micro_batches(seq_length: int, micro_batch: int, count: int, vocab_size: int, packed: bool,
                      mask_rate: float, device) -> List[Dict[str, torch.Tensor]]:
    """`count` different micro-batches (one training step), already on `device`."""
    lengths = document_lengths(seq_length, micro_batch * count)
    batches = [mlm_batch(lengths[i * micro_batch:(i + 1) * micro_batch], seq_length, vocab_size, packed,
                         mask_rate, seed=i) for i in range(count)]
    return [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in batches]


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_per_step(step: Callable[[], None], steps: int, warmup: int = WARMUP_STEPS[False]) -> float:
    for _ in range(warmup):
        step()
    _sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync()
    return (time.perf_counter() - start) / steps


def _peak_memory_gib() -> Optional[float]:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def _release_memory(compiled: bool) -> None:
    """Free the previous run's model before the next run (megatron-core's modules hold reference cycles), and
    around a compiled variant its graphs too, so that each starts far from dynamo's recompile limit. Not around
    an eager one: megatron-core's fusions (SwiGLU, cross-entropy) are torch.compile'd in every run, and would
    compile again after each reset."""
    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _attempt(run: Callable[[], Measurement], failed: Measurement, optional: bool) -> Measurement:
    """run(), or `failed` with the reason when it runs out of memory or, for an optional row (a compiled or FP8
    variant; every row with `keep_going`), fails in any way: one such failure must not cost the rest of a long GPU
    run. Each row is logged as it is measured: a run stopped by a time limit keeps those figures in its log."""
    _release_memory(failed.compiled)
    try:
        row = run()
        logger.info("measured: %s", " | ".join(table_cells(row)))
        return row
    except torch.OutOfMemoryError:
        reason = "out of memory"
    except Exception as e:
        if not optional:
            raise
        logger.exception("%s at length %d failed", failed.label, failed.seq_length)
        reason = f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:200]
    finally:
        _release_memory(failed.compiled)
    failed.error = reason
    logger.info("measured: %s", " | ".join(table_cells(failed)))
    return failed


def _largest_batch(run: Callable[[int], float], max_batch: int) -> Tuple[int, float]:
    """(batch, seconds per step) for the largest power-of-two batch up to max_batch that fits."""
    batch = max_batch
    while True:
        try:
            return batch, run(batch)
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
            torch.cuda.empty_cache()
            batch //= 2


def baseline_attention() -> str:
    """ModernBERT-base's and BERT-base's attention kernel: flash-attn 2 when it runs here (as
    ModernBERT is meant to run), else PyTorch SDPA. A weaker baseline would flatter the ratios."""
    from transformers.utils import is_flash_attn_2_available

    from megatron_neobert.kernels import probe

    runs = torch.cuda.is_available() and probe("flash_attn") and is_flash_attn_2_available()
    return "flash_attention_2" if runs else "sdpa"


class _HiddenStates(torch.nn.Module):
    """The megatron-core model called as the HF models are, giving its final hidden states."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        # As the HF models do: no mask when every token is real, so SDPA may pick its flash kernel.
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None
        return self.model(input_ids, attention_mask=attention_mask, return_hidden_states=True)


def inference_models(arch: NeoBERTArch, baselines: bool, small: bool, device, dtype) -> Dict[str, Callable]:
    """name -> a function building the model, called as model(input_ids=..., attention_mask=...), for each model
    compared (built on its first row, so that a model that fails to build fails its rows alone)."""
    import transformers

    from megatron_neobert.conversion.shape_bridge import hf_config_for_arch
    from megatron_neobert.hf import NeoBERT
    from megatron_neobert.model import build_model, transformer_config
    from megatron_neobert.parallel.launch import initialize_model_parallel

    cfg = hf_config_for_arch(arch)
    initialize_model_parallel(1, 1)
    config = transformer_config(arch, bf16=dtype == torch.bfloat16, params_dtype=dtype)
    makers = {"neobert-hf": lambda: NeoBERT(cfg), "neobert-megatron": lambda: _HiddenStates(build_model(arch, config))}
    if baselines:
        shrink = (dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)
                  if small else {})
        attention = baseline_attention()
        makers["modernbert-base"] = lambda: transformers.AutoModel.from_config(
            transformers.ModernBertConfig(**shrink), attn_implementation=attention, dtype=dtype)
        makers["bert-base"] = lambda: transformers.AutoModel.from_config(
            transformers.BertConfig(max_position_embeddings=8192, **shrink), attn_implementation=attention,
            dtype=dtype)
    return {name: (lambda make=make: make().to(device=device, dtype=dtype).eval()) for name, make in makers.items()}


def _measure_inference(row: Measurement, module: torch.nn.Module, steps: int, device) -> Measurement:
    """`row` measured at the largest batch up to its batch size that fits."""
    def run(batch):
        ids = torch.randint(5, 1000, (batch, row.seq_length), device=device)
        mask = torch.ones_like(ids, dtype=torch.bool)
        with torch.inference_mode():
            return time_per_step(lambda: module(input_ids=ids, attention_mask=mask), steps, WARMUP_STEPS[row.compiled])

    batch, seconds = _largest_batch(run, row.batch_size)
    return dataclasses.replace(row, batch_size=batch, tokens_per_s=batch * row.seq_length / seconds,
                               peak_memory_gib=_peak_memory_gib())


def benchmark_inference(arch: NeoBERTArch, seq_lengths: List[int], steps: int, max_batch: int,
                        baselines: bool = True, small: bool = False, compile: bool = False, keep_going: bool = False,
                        on_row: Callable[[Measurement], None] = lambda row: None) -> List[Measurement]:
    """The inference rows, each passed to `on_row` as it is measured; with `keep_going` a row that fails in any way
    is recorded with its error and the next one runs."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    precision = "bf16" if device == "cuda" else "fp32"
    makers = inference_models(arch, baselines, small, device, dtype)
    built = {}

    def model(name: str, compiled: bool) -> torch.nn.Module:
        if (name, False) not in built:
            built[name, False] = makers[name]()
        if compiled and (name, True) not in built:
            built[name, True] = torch.compile(built[name, False])
        return built[name, compiled]

    results = []
    for seq in seq_lengths:
        for name in makers:
            batch_limit = max_batch
            for compiled in [False] + ([True] if compile else []):
                row = Measurement("inference", name, seq, batch_limit, 0.0, precision, compiled)
                row = _attempt(lambda: _measure_inference(row, model(name, compiled), steps, device), row,
                               optional=compiled or keep_going)
                results.append(row)
                on_row(row)
                if row.error is None:  # the compiled variant starts at (and is compared at) eager's batch
                    batch_limit = row.batch_size
    _ratios(results, baseline="modernbert-base" if baselines else "neobert-hf")
    return results


def _reference_train_step(arch: NeoBERTArch, batches: List[dict], device, compiled: bool) -> Callable:
    """The released NeoBERT's way: HF model, padded, AdamW, bf16 autocast, head on every token,
    gradients accumulated over the micro-batches."""
    from megatron_neobert.conversion.shape_bridge import hf_config_for_arch
    from megatron_neobert.hf import NeoBERTLMHead

    cfg = hf_config_for_arch(arch)
    model = NeoBERTLMHead(cfg).to(device).train()
    if compiled:  # the whole model; dynamo splits it at its data-dependent checks (does a mask pad?)
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)

    def step():
        for batch in batches:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = model(input_ids=batch["tokens"], attention_mask=batch["attention_mask"],
                             labels=batch["labels"]).loss
            (loss / len(batches)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _megatron_train_step(shape: ModelShape, batches: List[dict], fp8: bool, compiled: bool,
                         losses: List[float]) -> Callable:
    """The trainer's step (`train_step`) for the model's `shape`, built by the trainer's own set-up from its flags, so
    that the figures are the trainer's; each step appends its loss to `losses`."""
    from megatron.core.utils import unwrap_model

    from megatron_neobert.training.config.arguments import parse_settings
    from megatron_neobert.training.engine import train_step
    from megatron_neobert.training.engine.forward_step import mlm_forward_step
    from megatron_neobert.training.engine.model_setup import setup_model_and_optimizer

    # No data is read: the batches are synthetic. No warmup: the steps learn at the peak rate from the first, so
    # that the losses compared between rows (FP8's and bf16's) are those of training, not of one forward repeated.
    flags = ["--mock-data", "--micro-batch-size", str(batches[0]["tokens"].shape[0]), "--lr-warmup-iters", "0"]
    flags += ["--bf16"] if torch.cuda.is_available() else []
    flags += ["--fp8-format", "hybrid", "--transformer-impl", "transformer_engine"] if fp8 else []
    settings = parse_settings(flags)
    _, chunks, optimizer, scheduler = setup_model_and_optimizer(settings, shape)
    if compiled:
        # The layers, not the model: the MLM head gathers the masked positions (a data-dependent
        # shape), and the DDP wrappers own the gradient hooks.
        for chunk in chunks:
            for layer in unwrap_model(chunk).decoder.layers:
                layer.compile()

    state = train_step.TrainState()

    def step():
        record = train_step.train_step(settings, chunks, optimizer, scheduler, batches, state, mlm_forward_step,
                                       pad_id=SYNTHETIC_PAD_ID)
        if record["skipped"]:  # a skipped step would time no update
            raise FloatingPointError(f"non-finite loss or gradient at step {record['iteration']}: the trainer "
                                     f"skipped it")
        losses.append(record["loss"])
    return step


def _measure_training(row: Measurement, arch: NeoBERTArch, batches: List[dict], steps: int, device) -> Measurement:
    reference = row.model.startswith("reference")
    losses = None if reference else []
    # Ours pads the vocabulary as the trainer does at TP 1 (--make-vocab-size-divisible-by's default).
    shape = ModelShape(arch, padded_vocab_size(arch.vocab_size), preset=None, base="the benchmark's arch")
    step = (_reference_train_step(arch, batches, device, row.compiled) if reference
            else _megatron_train_step(shape, batches, row.precision == "fp8", row.compiled, losses))
    seconds = time_per_step(step, steps, WARMUP_STEPS[row.compiled])
    real = sum(int(b["attention_mask"].sum()) if "attention_mask" in b else b["tokens"].numel() for b in batches)
    # The reference's head runs on every position, ours on the masked ones; each one's FLOPs count
    # what it computes (on real tokens), at the vocabulary size it computes.
    predicted = real if reference else sum(int((b["labels"] != -100).sum()) for b in batches)
    vocab = arch.vocab_size if reference else shape.padded_vocab_size
    # Synthetic tokens are >= 5: none is padding, so every packed piece is a document.
    pairs = sum(int(attended_pairs(b, pad_id=SYNTHETIC_PAD_ID)) for b in batches)
    tflops = step_flops(arch, real, predicted, pairs, vocab) / seconds / 1e12
    fp8 = row.precision == "fp8"
    peak, bf16_peak = peak_tflops(fp8=fp8), peak_tflops(fp8=False)
    return dataclasses.replace(row, tokens_per_s=real / seconds, peak_memory_gib=_peak_memory_gib(),
                               tflops_per_gpu=tflops, losses=losses, mfu=tflops / peak if peak else None,
                               mfu_of_bf16_peak=tflops / bf16_peak if fp8 and bf16_peak else None)


def fp8_unavailable() -> Optional[str]:
    """Why FP8 training cannot run here, or None when it can."""
    from megatron_neobert.kernels import transformer_engine_available

    if not torch.cuda.is_available():
        return "no GPU"
    if torch.cuda.get_device_capability() < (8, 9):
        return f"{torch.cuda.get_device_name()} has no FP8 tensor cores"
    if not transformer_engine_available():
        return "Transformer Engine does not import"
    return None


def training_runs(fp8: bool, compile: bool) -> List[Tuple[str, str, bool]]:
    """(model, precision, compiled) of each training run, each compiled variant after its eager one."""
    runs = [("reference-hf-padded", "bf16", False), ("megatron-padded", "bf16", False),
            ("megatron-packed", "bf16", False)]
    if compile:  # the HF reference and the trainer's packed step; see _megatron_train_step
        runs.insert(1, ("reference-hf-padded", "bf16", True))
        runs.append(("megatron-packed", "bf16", True))
    if fp8:
        runs.append(("megatron-packed", "fp8", False))
    return runs


def benchmark_training(arch: NeoBERTArch, seq_length: int, micro_batch: int, steps: int, micro_batches: int = 1,
                       mask_rate: float = 0.2, fp8: bool = False, compile: bool = False, keep_going: bool = False,
                       on_row: Callable[[Measurement], None] = lambda row: None) -> List[Measurement]:
    """The training rows at `seq_length`, each passed to `on_row` as it is measured; `keep_going` as in
    benchmark_inference."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = {packed: mlm_micro_batches(seq_length, micro_batch, micro_batches, arch.vocab_size, packed, mask_rate,
                                      device) for packed in (False, True)}
    no_fp8 = fp8_unavailable() if fp8 else None
    results = []
    for model, precision, compiled in training_runs(fp8, compile):
        batches = data[model.endswith("packed")]
        if device.type == "cpu" and precision == "bf16":
            precision = "fp32"  # no autocast, no bf16 weights on CPU
        row = Measurement("training", model, seq_length, micro_batch, 0.0, precision, compiled, micro_batches)
        if precision == "fp8" and no_fp8:
            row.error = f"not run: {no_fp8}"
        else:
            row = _attempt(lambda: _measure_training(row, arch, batches, steps, device), row,
                           optional=compiled or precision == "fp8" or keep_going)
        results.append(row)
        on_row(row)
    _ratios(results, baseline="reference-hf-padded")
    return results


def _ratios(results: List[Measurement], baseline: str) -> None:
    """Each figure over its baseline's (eager, same length) and a compiled one over its eager one's."""
    ok = [r for r in results if r.error is None]
    base = {r.seq_length: r.tokens_per_s for r in ok if r.model == baseline and not r.compiled}
    eager = {(r.model, r.precision, r.seq_length): r.tokens_per_s for r in ok if not r.compiled}
    for r in ok:
        if r.seq_length in base:
            r.ratio_to_baseline = r.tokens_per_s / base[r.seq_length]
        if r.compiled and (r.model, r.precision, r.seq_length) in eager:
            r.ratio_to_eager = r.tokens_per_s / eager[r.model, r.precision, r.seq_length]


# ---- output ------------------------------------------------------------------------------------
COLUMNS = ["benchmark", "model", "seq", "batch", "tokens/s", "x base", "x eager", "TFLOP/s", "MFU", "mem GiB"]


def table_cells(r: Measurement) -> List[str]:
    """The table's cells; a run without figures has the reason in their place."""
    batch = f"{r.batch_size}x{r.micro_batches}" if r.micro_batches > 1 else str(r.batch_size)
    if r.error:
        return [r.benchmark, r.label, str(r.seq_length), batch, r.error]
    ratio = lambda x: f"{x:.2f}x" if x is not None else "-"  # noqa: E731
    mfu = "-" if r.mfu is None else f"{r.mfu:.1%}"
    if r.mfu is not None and r.precision == "fp8":
        mfu += " of FP8 peak" + (f", {r.mfu_of_bf16_peak:.1%} of bf16" if r.mfu_of_bf16_peak is not None else "")
    return [r.benchmark, r.label, str(r.seq_length), batch, f"{r.tokens_per_s:,.0f}", ratio(r.ratio_to_baseline),
            ratio(r.ratio_to_eager), f"{r.tflops_per_gpu:.1f}" if r.tflops_per_gpu is not None else "-", mfu,
            f"{r.peak_memory_gib:.1f}" if r.peak_memory_gib is not None else "-"]


def format_table(results: List[Measurement]) -> str:
    rows = [COLUMNS] + [table_cells(r) for r in results]
    widths = [max(len(row[i]) for row in rows if len(row) == len(COLUMNS)) for i in range(len(COLUMNS))]
    # Names left-aligned, figures right-aligned; the reason for missing figures runs past the columns.
    pad = lambda row: " ".join(c.ljust(w) if i < 2 else c.rjust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(row, widths)))
    return "\n".join(pad(row) if len(row) == len(COLUMNS) else f"{pad(row[:4])} {row[4]}" for row in rows)


def plot(results: List[Measurement], path: str):
    """Inference tokens/s against length and the training variants' real tokens/s; returns the figure's axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ok = [r for r in results if r.error is None]
    inference = [r for r in ok if r.benchmark == "inference"]
    for label in dict.fromkeys(r.label for r in inference):
        rows = [r for r in inference if r.label == label]
        axes[0].plot([r.seq_length for r in rows], [r.tokens_per_s / 1e3 for r in rows], marker="o", label=label,
                     linestyle="--" if rows[0].compiled else "-")
    # Log-2 axis ticked at the measured lengths, written out (64, 128, ...), not at powers of ten between them.
    lengths = sorted({r.seq_length for r in inference})
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(lengths, [str(n) for n in lengths])
    axes[0].minorticks_off()
    axes[0].set(xlabel="sequence length (tokens)", ylabel="10^3 tokens/s", title="Inference")
    if inference:
        axes[0].legend()
    training = [r for r in ok if r.benchmark == "training"]
    axes[1].bar([f"{r.label}\n@{r.seq_length}" for r in training], [r.tokens_per_s / 1e3 for r in training])
    axes[1].set(ylabel="10^3 real tokens/s", title="Training step")
    axes[1].tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return axes
