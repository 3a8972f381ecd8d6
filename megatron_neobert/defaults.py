"""Choices and defaults that tools show in --help, kept free of torch and transformers so that a tool parses its
flags at once and imports the library modules that use these only after."""

# dtype names that flags take -> torch's names.
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
               "bfloat16": "bfloat16", "bf16": "bfloat16"}
CONVERSION_DTYPES = ("fp32", "bf16")  # what checkpoint conversion writes
DEFAULT_BENCHMARK = "MTEB(eng, v1)"  # what run_mteb evaluates
DEFAULT_BUCKETS = (128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192)  # pseudo-perplexity's length buckets
# The failure rate --save-interval auto and the goodput model assume: Llama 3 (Dubey et al. 2024, table 5), 419
# unexpected interruptions in 54 days on 16,384 H100s, 4.74e-4.
LLAMA3_FAILURES_PER_GPU_DAY = 4.7e-4


def torch_dtypes(names):
    """{name: torch dtype} for dtype names of DTYPE_NAMES."""
    import torch

    return {name: getattr(torch, DTYPE_NAMES[name]) for name in names}
