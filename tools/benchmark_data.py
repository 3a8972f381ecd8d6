"""Data-pipeline benchmark on the built-in sample corpus (or any Parquet file), in one run:

1. preprocessing throughput: preprocess_data with N workers (BERT WordPiece: each distinct
   whitespace-delimited piece encoded once, tokenizer.WordPieceCache; other tokenizers: batched
   encoding in the Rust backend) against Megatron-LM's loop with the same N worker processes: megatron-core's
   HuggingFaceTokenizer.text_to_ids on one document at a time (Pool.imap, 32 per task), in interleaved pairs,
   and against a plain backend loop in one process; on --corpus, or with --preprocess-documents N on a
   RefinedWeb-like corpus of N documents drawn from it (refinedweb_like_corpus: the sample corpus is too small
   for a worker's word-piece cache to warm up as it does on a real corpus);
2. the share of real (non-pad) tokens per batch, packed against padded samples, at one length, and what the
   torch loader gives in one process (tokens/s: the samples read, masked and collated);
3. the layout builder at scale: packed and padded layouts of --layout-documents synthetic
   documents (RefinedWeb-like lengths: lognormal, mean about 650 tokens), time and peak memory
   measured in a fresh process, and the cost per document extrapolated to 1B documents;
4. beside it, the trainer's real dataset build of a corpus of as many documents, written as Megatron-LM's
   tool writes it (no record) and as ours (with our record), the .bin sparse: cold (no cache) and warm
   (cached) starts, time, peak memory, private and memory-mapped memory, extrapolated to 1B documents; and
   side by side with megatron-core's GPTDataset build (its C++ sample index, document and sample shuffles) of
   the same index at the same length, each in its own process: time, peak memory, samples, cache on disk;
5. the start of a --data-args-path blend of --blend-prefixes small corpora, cold and cached;
6. a merge of 4 datasets (--merge-documents in all) by megatron-core's IndexedDatasetBuilder.add_index and by ours
   (IndexedWriter), time, peak memory and whether the bytes are the same.

    python tools/benchmark_data.py [--corpus X.parquet] [--preprocess-documents 100000] [--tokenizer-model DIR]
        [--workers 2]
        [--layout-documents 20000000] [--blend-prefixes 1000] [--merge-documents 20000000] [--scratch DIR]
"""

import collections
import dataclasses
import functools
import os
import re
import sys
import tempfile
import time
from typing import Optional

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per process, fair counts

from megatron_neobert.data.assets import SAMPLE_CORPUS, SAMPLE_TOKENIZER  # noqa: E402
from megatron_neobert.flags import ArgumentParser, add_flags, setting  # noqa: E402


def real_token_share(prefix, tokenizer, seq_length, packed, micro_batch_size):
    from megatron_neobert.data.datasets.loader import build_data_loader
    from megatron_neobert.data.datasets.mlm_dataset import MLMDatasetConfig, build_mlm_datasets
    config = MLMDatasetConfig(random_seed=1234, sequence_length=seq_length, blend=([prefix], None),
                              split="1,0,0", tokenizer=tokenizer, packed=packed,
                              path_to_cache=os.path.join(os.path.dirname(prefix), "cache"))
    train = build_mlm_datasets(config, [None, None, None])[0]
    real = total = batches = 0
    start = time.perf_counter()
    for batch in build_data_loader(train, micro_batch_size, num_workers=0, drop_last=False):
        tokens = batch["tokens"]
        mask = batch.get("attention_mask")
        real += int(mask.sum()) if mask is not None else int((tokens != tokenizer.pad_id).sum())
        total += tokens.numel()
        batches += 1
    return real / total, len(train), batches, total / (time.perf_counter() - start)


_megatron_tokenizer = None


def _megatron_init(model):
    global _megatron_tokenizer
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import HuggingFaceTokenizer
    # Given explicitly: megatron-core 0.17 changed both defaults (to True), and the baseline is the slow tokenizer
    # without special tokens that the figures in docs/performance.md were measured with.
    _megatron_tokenizer = HuggingFaceTokenizer(model, use_fast=False, include_special_tokens=False)


def _megatron_encode(text):
    return len(_megatron_tokenizer.text_to_ids(text))


def megatron_lm_loop(texts, model, workers):
    """Tokens and seconds of Megatron-LM's encoder loop (one document per call) on `workers`."""
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(workers, _megatron_init, (model,)) as pool:
        pool.map(_megatron_encode, texts[:workers], 1)  # every worker has loaded its tokenizer
        start = time.perf_counter()
        tokens = sum(pool.imap(_megatron_encode, texts, 32))
        return tokens, time.perf_counter() - start


@functools.lru_cache(maxsize=None)
def _sentence_source(source, tokenizer_model):
    """What refinedweb_like_corpus draws from `source` (once per process): its sentences as lists of pieces, its
    pieces seen once, Heaps' law fitted on it (log K and beta) and its pieces per token."""
    import numpy
    import pyarrow.parquet as pq
    from megatron_neobert.data.tokenizer import build_tokenizer
    texts = pq.read_table(source, columns=["content"]).column("content").to_pylist()
    sentences = [s.split() for text in texts for s in re.split(r"(?<=[.!?])\s+", text)]
    # Heaps' law on the source, its documents in random order: log(distinct) against log(pieces seen).
    stream = [p for i in numpy.random.default_rng(0).permutation(len(texts)) for p in texts[i].split()]
    seen = set()
    distinct = numpy.cumsum(numpy.fromiter((p not in seen and not seen.add(p) for p in stream), bool, len(stream)))
    seen_at = numpy.geomspace(len(stream) / 100, len(stream), 20).astype(numpy.int64)
    beta, log_k = numpy.polyfit(numpy.log(seen_at), numpy.log(distinct[seen_at - 1]), 1)
    rare = [p for p, c in collections.Counter(stream).items() if c == 1]
    tokens = sum(map(len, build_tokenizer("HuggingFaceTokenizer", tokenizer_model).tokenize_documents(texts)))
    return [s for s in sentences if s], rare, log_k, beta, len(stream) / tokens


def refinedweb_like_corpus(path, documents, seed=0, source=SAMPLE_CORPUS, tokenizer_model=SAMPLE_TOKENIZER):
    """Write (once: an existing `path` is reused; written atomically) a JSONL file of `documents` records
    ({"content": text}) drawn from the `source` corpus, for timing preprocessing at a scale where a worker's
    WordPieceCache is as warm as on a real corpus, and return `path`.

    What it keeps of real text: the source's sentences (whole, in their own word order, drawn at random with
    replacement, so every piece keeps its spelling, punctuation and frequency), document lengths like RefinedWeb's
    (lognormal in tokens, mean about 650, as the layout benchmark's), and the vocabulary's long tail: distinct
    pieces keep growing with the corpus by Heaps' law fitted on the source (distinct pieces = K n^beta after n
    pieces), the ones the source runs out of made new by splicing a prefix of one of its once-seen pieces (rare
    words, numbers, names, code) to the suffix of another. Repeating whole documents instead would let the
    cache meet nothing new after the first pass and flatter it. What it does not keep: the order of sentences
    within a document (no topic), the source's whitespace (pieces are joined by single spaces: the same tokens
    for BERT WordPiece), and any vocabulary the source lacks (a web crawl's languages, URLs, boilerplate):
    extrapolating the source's Heaps exponent to a crawl is the assumption."""
    import json
    import numpy
    from megatron_neobert.atomic_write import atomic_file
    if os.path.exists(path):
        return path
    sentences, rare, log_k, beta, pieces_per_token = _sentence_source(source, tokenizer_model)
    rng = numpy.random.default_rng(seed)
    pieces_per_doc = numpy.maximum(1, rng.lognormal(6.0, 1.0, documents) * pieces_per_token).astype(numpy.int64)
    seen, total = set(), 0
    with atomic_file(path, "w", encoding="utf-8") as f:
        for target in pieces_per_doc:  # generation, not timed: a loop per document is fine here
            doc = []
            while len(doc) < target:
                doc += sentences[rng.integers(len(sentences))]
            del doc[target:]
            total += len(doc)
            seen.update(doc)
            missing = min(int(numpy.exp(log_k) * total ** beta) - len(seen), len(doc))
            for at in rng.choice(len(doc), missing, replace=False) if missing > 0 else ():
                piece = doc[at]
                while piece in seen:
                    a, b = rare[rng.integers(len(rare))], rare[rng.integers(len(rare))]
                    piece = a[:rng.integers(1, len(a) + 1)] + b[rng.integers(len(b)):]
                doc[at] = piece
                seen.add(piece)
            f.write(json.dumps({"content": " ".join(doc)}) + "\n")
    return path


# This process's own peak for the scripts below: ru_maxrss carries the parent's resident size over fork and exec.
_PEAK_KB = """
def peak_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
"""
# The scripts that import megatron-core do it as the trainer and the tools do: its fusions' torch.compile deferred
# to their first call, so that torch's compiler stack (about 3 s of each fresh process) is not imported for nothing.
_MEGATRON_CORE = """
from megatron_neobert.kernels import import_megatron_core
import_megatron_core()
"""

_LAYOUT_SCRIPT = _PEAK_KB + """
import json, sys, time, numpy
from megatron_neobert.data.datasets.packing import chunk_starts, pack_starts
n, seq, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
lengths = numpy.maximum(1, numpy.random.default_rng(0).lognormal(6.0, 1.0, n)).astype(numpy.int32)
base = peak_kb()
start = time.perf_counter()
layout = (pack_starts if mode == "packed" else chunk_starts)(lengths, seq)
seconds = time.perf_counter() - start
peak = peak_kb() - base
print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "mean_length": float(lengths.mean()),
                  "arrays_mb": sum(a.nbytes for a in layout) / 2**20, "samples": int(layout.position.shape[0])}))
"""


def layout_at_scale(documents, seq_length, mode):
    import json
    import subprocess
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
    out = subprocess.run([sys.executable, "-c", _LAYOUT_SCRIPT, str(documents), str(seq_length),
                          mode], check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1"))
    return json.loads(out.stdout)


def write_sparse_corpus(prefix, documents, seed=0, record=None, chunk=1 << 24):
    """A corpus as Megatron-LM's tool writes it: an ``.idx`` of `documents` single-sequence documents of
    RefinedWeb-like lengths (lognormal, mean about 650 tokens), written a chunk at a time, and a sparse ``.bin`` of
    their size (its tokens read as zeros; it costs no disk). With `record`, our tokenizer record beside it (our own
    data). Returns the number of tokens."""
    import json
    import struct

    import numpy
    from megatron.core.datasets.indexed_dataset import DType

    from megatron_neobert.megatron_core_compat import index_header

    rng, itemsize = numpy.random.default_rng(seed), 2
    lengths = [numpy.maximum(1, rng.lognormal(6.0, 1.0, min(chunk, documents - lo))).astype(numpy.int32)
               for lo in range(0, documents, chunk)]
    with open(prefix + ".idx", "wb") as f:
        f.write(index_header() + struct.pack("<QBQQ", 1, DType.code_from_dtype(numpy.uint16), documents,
                                            documents + 1))
        for part in lengths:
            f.write(part.tobytes())
        tokens = 0
        for part in lengths:
            pointers = numpy.zeros(part.shape[0], numpy.int64)
            numpy.cumsum(part[:-1], out=pointers[1:])
            f.write(((pointers + tokens) * itemsize).tobytes())
            tokens += int(part.sum(dtype=numpy.int64))
        for lo in range(0, documents + 1, chunk):
            f.write(numpy.arange(lo, min(documents + 1, lo + chunk), dtype=numpy.int64).tobytes())
    with open(prefix + ".bin", "wb") as f:
        f.truncate(tokens * itemsize)
    if record is not None:
        with open(prefix + ".tokenizer.json", "w") as f:
            json.dump(record, f)
    return tokens


_BUILD_SCRIPT = _PEAK_KB + _MEGATRON_CORE + """
import json, sys, time, os, numpy, psutil
from megatron_neobert.data.datasets.mlm_dataset import LAYOUT_FIELDS
from megatron_neobert.data.datasets.trainer_datasets import build_trainer_datasets
from megatron_neobert.data.tokenizer import build_tokenizer
from megatron_neobert.training.config.arguments import parse_settings
settings = parse_settings(json.loads(sys.argv[1]))
tokenizer = build_tokenizer(settings.data.tokenizer_type, settings.data.tokenizer_model)
private = psutil.Process().memory_full_info().uss
start = time.perf_counter()
datasets = build_trainer_datasets(settings, tokenizer)
seconds = time.perf_counter() - start
parts = getattr(datasets[0], "datasets", [datasets[0]])
mapped = sum(getattr(part, name).nbytes for part in parts for name in LAYOUT_FIELDS) + sum(
    os.path.getsize(part.dataset_path + ".idx") for part in parts)
print(json.dumps({"seconds": seconds, "peak_mb": peak_kb() / 1024,
                  "private_added_mb": (psutil.Process().memory_full_info().uss - private) / 2**20,
                  "mapped_mb": mapped / 2**20, "samples": len(datasets[0])}))
"""


# megatron-core's GPT dataset build through its builder, as Megatron-LM's pretrain_gpt.py makes it: the tokenizer
# only gives the vocabulary size (the dtype of its token ids) and the EOD id, which building the indices never reads.
_GPT_BUILD_SCRIPT = _PEAK_KB + _MEGATRON_CORE + """
import json, sys, time, types
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
prefix, seq, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tokenizer = types.SimpleNamespace(vocab_size=30522, eod=0, unique_identifiers={"class": "stand-in"})
config = GPTDatasetConfig(random_seed=1234, sequence_length=seq, blend=([prefix], None), split="100,0,0",
                          path_to_cache=cache, tokenizer=tokenizer, reset_position_ids=False,
                          reset_attention_mask=False, eod_mask_loss=False)
base, start = peak_kb(), time.perf_counter()
train = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()[0]
print(json.dumps({"seconds": time.perf_counter() - start, "peak_mb": peak_kb() / 1024, "base_mb": base / 1024,
                  "samples": len(train)}))
"""


def _in_process(script, *args):
    """A benchmark script's JSON line, in a fresh process of this checkout."""
    import json
    import subprocess
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1"))
    if out.returncode:
        raise RuntimeError(f"the dataset build failed: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def trainer_build(flags):
    """The trainer's dataset build (blend, split, document tables, layouts, caches) in a fresh process:
    seconds, peak resident memory of the whole process, private memory the build added, train samples."""
    import json
    return _in_process(_BUILD_SCRIPT, json.dumps(flags))


def gpt_build(prefix, seq_length, cache):
    """megatron-core's GPTDataset build of `prefix` (split 100,0,0, one epoch) in a fresh process, no cache: seconds,
    peak resident memory of the whole process and before the build, samples, and the cache it wrote (MB)."""
    result = _in_process(_GPT_BUILD_SCRIPT, prefix, str(seq_length), cache)
    return {**result, "cache_mb": folder_mb(cache)}


def folder_mb(folder):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files) / 2**20


def build_at_scale(documents, seq_length, tokenizer_model, folder):
    """Cold (no cache) and warm trainer builds of a `documents`-document corpus, as Megatron-LM writes it and
    with our record, length `seq_length`, split 100,0,0 (one epoch), each with the cache it wrote (MB); and
    megatron-core's GPTDataset build of the first between our cold and warm builds."""
    from megatron_neobert.data.records import tokenizer_record
    from megatron_neobert.data.tokenizer import build_tokenizer
    record = tokenizer_record(build_tokenizer("HuggingFaceTokenizer", tokenizer_model), append_eod=False)
    results, gpt = {}, None
    for name, rec in (("Megatron-LM's", None), ("ours", {**record, "max_token_id": 0})):
        prefix = os.path.join(folder, "megatron" if rec is None else "ours")
        write_sparse_corpus(prefix, documents, record=rec)
        os.sync()  # the corpus is on disk before the build is timed, as a real one is
        flags = ["--data-path", prefix, "--split", "100,0,0", "--seq-length", str(seq_length), "--train-iters", "10",
                 "--global-batch-size", "1", "--micro-batch-size", "1", "--eval-iters", "0",
                 "--lr-warmup-iters", "0", "--data-cache-path", os.path.join(folder, f"cache_{len(results)}"),
                 "--tokenizer-model", tokenizer_model]
        cold = {**trainer_build(flags), "cache_mb": folder_mb(os.path.join(folder, f"cache_{len(results)}"))}
        if rec is None:
            gpt = gpt_build(prefix, seq_length, os.path.join(folder, "gpt_cache"))
        results[name] = [cold, trainer_build(flags)]  # cold, then warm
        for suffix in (".bin", ".idx"):
            os.remove(prefix + suffix)
    return results, gpt


def blend_start(prefixes, tokenizer_model, folder):
    """A --data-args-path blend of `prefixes` small corpora: the first build and a start with the caches."""
    paths = []
    for i in range(prefixes):
        paths.append(os.path.join(folder, f"shard{i:05d}"))
        write_sparse_corpus(paths[-1], 2_000, seed=i)
    args_file = os.path.join(folder, "blend.txt")
    with open(args_file, "w") as f:
        f.writelines(f"1 {p}\n" for p in paths)
    flags = ["--data-args-path", args_file, "--split", "99,1,0", "--seq-length", "1024", "--train-iters", "1000",
             "--global-batch-size", "256", "--micro-batch-size", "8", "--eval-iters", "1", "--eval-interval", "500",
             "--lr-warmup-iters", "0", "--data-cache-path", os.path.join(folder, "cache"),
             "--tokenizer-model", tokenizer_model]
    return trainer_build(flags), trainer_build(flags)


@dataclasses.dataclass(frozen=True)
class DataBenchmarkFlags:
    corpus: str = setting(SAMPLE_CORPUS, "RefinedWeb-style Parquet file to tokenize")
    tokenizer_type: str = setting("HuggingFaceTokenizer", "as Megatron-LM's")
    tokenizer_model: str = setting(SAMPLE_TOKENIZER, "Hugging Face name or folder")
    workers: int = setting(2, "tokenizer worker processes")
    seq_length: int = setting(1024, "sequence length of the batches compared")
    micro_batch_size: int = setting(8, "sequences per batch")
    repeats: int = setting(3, "best of N timings (the cores may be shared with other work)")
    layout_documents: int = setting(20_000_000, "synthetic documents for the layout benchmark and the trainer's "
                                                "build beside it (0: skip both)")
    blend_prefixes: int = setting(1000, "corpora in the --data-args-path blend whose start is timed (0: skip it)")
    merge_documents: int = setting(20_000_000, "documents in the merge timed against megatron-core's builder (0: "
                                               "skip it)")
    preprocess_documents: int = setting(0, "time section 1 on a RefinedWeb-like corpus of N documents drawn from "
                                           "--corpus (built once, kept in --scratch; 0: --corpus itself)")
    scratch: Optional[str] = setting(None, "folder for the synthetic corpora (sparse files; the default is a "
                                           "temporary folder)")


def main(argv=None):
    parser = ArgumentParser(description=__doc__)
    add_flags(parser, DataBenchmarkFlags)
    args = parser.parse_args(argv)

    import pyarrow.parquet as pq
    from megatron_neobert.data.preprocessing.preprocess import preprocess_data
    from megatron_neobert.data.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model)
    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        corpus = args.corpus
        if args.preprocess_documents:
            import json
            # Kept in --scratch across runs (the corpus takes longer to build than to time); a temporary one else.
            name = f"refinedweb_like_{args.preprocess_documents}_{os.path.basename(args.corpus)}.jsonl"
            corpus = refinedweb_like_corpus(os.path.join(args.scratch or tmp, name), args.preprocess_documents,
                                            source=args.corpus, tokenizer_model=args.tokenizer_model)
            with open(corpus, encoding="utf-8") as f:
                texts = [json.loads(line)["content"] for line in f]
        else:
            texts = pq.read_table(corpus, columns=["content"]).column("content").to_pylist()
        plain_seconds = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            plain_tokens = sum(len(tokenizer.tokenize(text)) for text in texts)
            plain_seconds = min(plain_seconds, time.perf_counter() - start)

        # Interleaved pairs, Megatron-LM's first in one and ours first in the next, so that a change of load on
        # shared cores falls on both; each pair's ratio and load average are printed.
        megatron_seconds, runs, pairs = float("inf"), [], []
        for repeat in range(args.repeats):
            pair = {}
            for tool in ("megatron", "ours") if repeat % 2 == 0 else ("ours", "megatron"):
                if tool == "megatron":
                    megatron_tokens, pair[tool] = megatron_lm_loop(texts, args.tokenizer_model, args.workers)
                    assert megatron_tokens == plain_tokens, (megatron_tokens, plain_tokens)
                else:
                    runs.append(preprocess_data([corpus], os.path.join(tmp, "bench"), progress=False,
                                                json_keys=["content"], tokenizer_type=args.tokenizer_type,
                                                tokenizer_model=args.tokenizer_model, workers=args.workers))
                    assert runs[-1].tokens == plain_tokens, (runs[-1].tokens, plain_tokens)
                    pair[tool] = runs[-1].seconds
            megatron_seconds = min(megatron_seconds, pair["megatron"])
            pairs.append((pair["megatron"] / pair["ours"], os.getloadavg()[0]))
        stats = min(runs, key=lambda r: r.seconds)
        prefix = stats.outputs["content"]
        packed = real_token_share(prefix, tokenizer, args.seq_length, True, args.micro_batch_size)
        padded = real_token_share(prefix, tokenizer, args.seq_length, False, args.micro_batch_size)

    print(f"\ncorpus: {corpus} ({len(texts):,} documents, {plain_tokens:,} tokens); "
          f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}; "
          f"best of {args.repeats}")
    print("\n1. preprocessing throughput (same tokenizer, same tokens)")
    print(f"   {'plain loop, 1 process':<38}{plain_tokens / plain_seconds:>12,.0f} tokens/s"
          f"  ({plain_seconds:.2f} s, tokenizing only)")
    megatron_rate = megatron_tokens / megatron_seconds
    workers = f"{args.workers} worker{'s' if args.workers != 1 else ''}"
    print(f"   {f'Megatron-LM loop, {workers}':<38}{megatron_rate:>12,.0f} tokens/s"
          f"  ({megatron_seconds:.2f} s, tokenizing only)")
    print(f"   {f'preprocess_data, {workers}':<38}{stats.tokens_per_second:>12,.0f} "
          f"tokens/s  ({stats.seconds:.2f} s, reading + tokenizing + writing .bin/.idx)")
    print(f"   speed-up: {stats.tokens_per_second / megatron_rate:.2f}x Megatron-LM's loop, "
          f"{stats.tokens_per_second / (plain_tokens / plain_seconds):.2f}x the plain loop")
    print("   pairs (Megatron-LM's seconds / ours, load average): "
          + ", ".join(f"{ratio:.2f}x ({load:.1f})" for ratio, load in pairs))
    per_worker = stats.tokens_per_second / args.workers
    print(f"   RefinedWeb's 600B tokens at {per_worker:,.0f} tokens/s per worker: "
          f"{600e9 / per_worker / 3600:,.0f} worker-hours ({600e9 / megatron_rate * args.workers / 3600:,.0f} "
          f"with Megatron-LM's loop), e.g. {600e9 / per_worker / 3600 / 1024:.1f} h on 1,024 workers")
    print(f"\n2. real (non-pad) tokens per batch at length {args.seq_length}, "
          f"micro batch {args.micro_batch_size}, one epoch")
    print(f"   {'mode':<10}{'real tokens':>12}{'samples':>10}{'batches':>10}{'loader tokens/s':>17}")
    for name, (share, samples, batches, rate) in (("packed", packed), ("padded", padded)):
        print(f"   {name:<10}{share:>12.1%}{samples:>10,}{batches:>10,}{rate:>17,.0f}")
    print("   (loader: the torch loader in this process, no worker: samples read, masked, collated)")
    print(f"   padded mode needs {padded[1] / packed[1]:.2f}x the samples for the same tokens")
    if args.layout_documents:
        n = args.layout_documents
        print(f"\n3. layout of {n:,} synthetic documents at length {args.seq_length} (fresh process)")
        print(f"   {'mode':<8}{'seconds':>9}{'peak MB':>9}{'arrays MB':>11}{'samples':>13}"
              f"{'us/doc':>8}{'1B docs':>9}")
        for mode in ("packed", "padded"):
            r = layout_at_scale(n, args.seq_length, mode)
            per_doc = r["seconds"] / n
            print(f"   {mode:<8}{r['seconds']:>9.1f}{r['peak_mb']:>9,.0f}{r['arrays_mb']:>11,.0f}"
                  f"{r['samples']:>13,}{per_doc * 1e6:>8.2f}{per_doc * 1e9 / 60:>7.1f} min")
        print(f"   (mean document length {r['mean_length']:.0f} tokens; peak = resident memory "
              "added by the build, input lengths excluded)")
        with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
            report_build(*build_at_scale(n, args.seq_length, args.tokenizer_model, tmp), n, args.seq_length)
    if args.blend_prefixes:
        with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
            cold, warm = blend_start(args.blend_prefixes, args.tokenizer_model, tmp)
        print(f"\n5. a --data-args-path blend of {args.blend_prefixes:,} corpora (2,000 documents each), split 99,1,0: "
              f"first build {cold['seconds']:.1f} s, start with the caches {warm['seconds']:.1f} s "
              f"({warm['seconds'] / args.blend_prefixes * 1e3:.2f} ms a corpus), peak {warm['peak_mb']:,.0f} MB")
    if args.merge_documents:
        with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
            merged, same = merge_at_scale(args.merge_documents, tmp)
        theirs, ours = merged["megatron-core"], merged["ours"]
        print(f"\n6. a merge of 4 datasets, {args.merge_documents:,} documents in all, a fresh process each: "
              f"megatron-core's IndexedDatasetBuilder.add_index {theirs['seconds']:.1f} s, peak "
              f"{theirs['peak_mb']:,.0f} MB;\n   ours (IndexedWriter) {ours['seconds']:.1f} s, peak "
              f"{ours['peak_mb']:,.0f} MB: {theirs['seconds'] / ours['seconds']:.1f}x faster, "
              f"{'the same bytes' if same else 'OTHER BYTES'}")


_MERGE_SCRIPT = _PEAK_KB + _MEGATRON_CORE + """
import json, sys, time, numpy
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from megatron_neobert.data.preprocessing.index_writer import IndexedWriter
out, how, shards = sys.argv[1], sys.argv[2], sys.argv[3:]
start = time.perf_counter()
writer = (IndexedWriter(out + ".bin", numpy.uint16) if how == "ours"
          else IndexedDatasetBuilder(out + ".bin", dtype=numpy.uint16))
for shard in shards:
    writer.add_index(shard)
writer.finalize(out + ".idx")
print(json.dumps({"seconds": time.perf_counter() - start, "peak_mb": peak_kb() / 1024}))
"""


def merge_at_scale(documents, folder, shards=4):
    """Merges of `shards` datasets of `documents` single-sequence documents in all (2 tokens each: the index is
    what is measured), by megatron-core's IndexedDatasetBuilder.add_index and by ours, a fresh process each:
    {name: {seconds, peak_mb}}, and whether the two wrote the same bytes."""
    import filecmp
    import json
    import subprocess

    import numpy

    from megatron_neobert.data.preprocessing.index_writer import IndexedWriter
    prefixes = []
    for i in range(shards):
        n = documents // shards
        prefixes.append(os.path.join(folder, f"shard{i}"))
        writer = IndexedWriter(prefixes[-1] + ".bin", numpy.uint16)
        writer.write_tokens(numpy.random.default_rng(i).integers(0, 30_000, 2 * n, dtype=numpy.uint16))
        writer.add_documents(numpy.full(n, 2, numpy.int32), numpy.arange(n + 1))
        writer.finalize(prefixes[-1] + ".idx")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
    results = {}
    for name in ("megatron-core", "ours"):
        out = subprocess.run([sys.executable, "-c", _MERGE_SCRIPT, os.path.join(folder, name), name, *prefixes],
                             check=True, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=root))
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    same = all(filecmp.cmp(os.path.join(folder, "megatron-core" + s), os.path.join(folder, "ours" + s), False)
               for s in (".bin", ".idx"))
    return results, same


def report_build(results, gpt, documents, seq_length):
    print(f"\n4. the trainer's dataset build of the same number of documents, length {seq_length}, split 100,0,0 "
          "(blend, split, document table, layout, caches), a fresh process each: cold (no cache), warm (cached)")
    print(f"   {'data':<15}{'start':<7}{'seconds':>9}{'peak MB':>9}{'private MB':>12}{'mapped MB':>11}"
          f"{'us/doc':>8}")
    for name, (cold, warm) in results.items():
        for start, r in (("cold", cold), ("warm", warm)):
            print(f"   {name if start == 'cold' else '':<15}{start:<7}{r['seconds']:>9.3f}{r['peak_mb']:>9,.0f}"
                  f"{r['private_added_mb']:>12,.0f}{r['mapped_mb']:>11,.0f}{r['seconds'] / documents * 1e6:>8.3f}")
    print("   peak: resident memory of the whole process (torch and megatron-core are about 400 MB of it); private: "
          "what the build\n   added that no other process shares; mapped: the layout arrays and the .idx, "
          "memory-mapped (page cache, shared by a node's ranks)")
    cold, warm = results["Megatron-LM's"]
    scale = 1e9 / documents
    built_gb = (warm["peak_mb"] + (cold["peak_mb"] - warm["peak_mb"]) * scale) / 1024
    mapped_gb = warm["mapped_mb"] * scale / 1024
    print(f"   at 1B documents, Megatron-LM's data: the cold build, once, in one process (rank 0, or "
          f"tools/build_data_cache.py ahead of the job)\n   about {cold['seconds'] * scale / 60:.0f} min and "
          f"{built_gb:,.0f} GB; a start with the caches keeps {warm['private_added_mb']:.0f} MB of each rank's own "
          "(megatron-core's builder makes a\n   split's document range for a moment: 4 bytes a document, 4 GB at 1B) "
          f"and {mapped_gb:,.0f} GB memory-mapped, the same pages for the 8 ranks "
          f"of a node: {mapped_gb:,.0f} GB of page cache a node, not {8 * mapped_gb:,.0f}")
    print(f"\n   side by side, Megatron-LM's data: our packed MLM build and megatron-core's GPTDataset build (its C++ "
          "sample index,\n   the document and sample shuffles), no cache, a fresh process each")
    print(f"   {'build':<28}{'samples':>13}{'seconds':>9}{'peak MB':>9}{'cache MB':>10}    at 1B documents")
    ours = {**cold, "warm_peak_mb": warm["peak_mb"]}
    theirs = {**gpt, "warm_peak_mb": gpt["base_mb"]}
    for name, r in (("ours (MLMDataset, packed)", ours), ("megatron-core GPTDataset", theirs)):
        peak_gb = (r["warm_peak_mb"] + (r["peak_mb"] - r["warm_peak_mb"]) * scale) / 1024
        print(f"   {name:<28}{r['samples']:>13,}{r['seconds']:>9.2f}{r['peak_mb']:>9,.0f}{r['cache_mb']:>10,.0f}"
              f"    {r['seconds'] * scale / 60:.1f} min, {peak_gb:,.0f} GB peak, "
              f"{r['cache_mb'] * scale / 1024:,.0f} GB cache")
    print(f"   {'ours / megatron-core':<28}{ours['samples'] / theirs['samples']:>13.3f}"
          f"{ours['seconds'] / theirs['seconds']:>9.2f}{ours['peak_mb'] / theirs['peak_mb']:>9.2f}"
          f"{ours['cache_mb'] / theirs['cache_mb']:>10.2f}")
    print("   (1B: the time, and the memory above a start with the cache (megatron-core's: above its imports), scaled "
          "by the\n   documents; ours includes the check of the whole index and the corpus's document table, which "
          "megatron-core does\n   not make)")


if __name__ == "__main__":
    main()
