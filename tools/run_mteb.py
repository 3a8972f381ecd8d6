#!/usr/bin/env python
"""MTEB (mteb 2.x) evaluation of an exported NeoBERT embedding folder, with the paper's per-task instructions.

    python tools/run_mteb.py --model neobert-embed --output results/neobert-embed            # MTEB(eng, v1)
    python tools/run_mteb.py --model neobert-embed --output results/x --tasks STS12 NFCorpus --dtype bf16
    python tools/run_mteb.py --model cde-folder --cde --output results/cde --tasks SciFact

Writes summary.md / summary.json (by task type, beside the paper's numbers) and mteb's per-task results under
--cache (default <output>/mteb_cache), keyed by a revision hashed from the weights, config, dtype and instructions.
"""

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_neobert.embeddings.mteb_eval import (DEFAULT_BENCHMARK, DTYPES, NeoBERTEncoder,  # noqa: E402
                                                   resolve_tasks, run_mteb)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="exported NeoBERT folder (or a CDE folder with --cde)")
    p.add_argument("--output", required=True)
    p.add_argument("--tasks", nargs="+", default=[DEFAULT_BENCHMARK], help="task and/or benchmark names")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float16", help="the paper evaluates in float16")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--no-instructions", action="store_true")
    p.add_argument("--name", default=None, help="model name in mteb's cache (default: the folder name)")
    p.add_argument("--cache", default=None)
    p.add_argument("--overwrite", action="store_true", help="re-run tasks already in the cache")
    p.add_argument("--device", default=None)
    p.add_argument("--cde", action="store_true", help="the folder is a contextual (CDE) model")
    p.add_argument("--cde-context-size", type=int, default=None, help="context documents per task (default: trained J)")
    return p


def main(argv=None, tasks=None):
    """`tasks` (task objects) replaces --tasks; tests use it for local tasks."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    tasks = tasks if tasks is not None else resolve_tasks(args.tasks)
    common = dict(dtype=args.dtype, device=args.device, batch_size=args.batch_size, max_length=args.max_length,
                  use_instructions=not args.no_instructions, name=args.name)
    if args.cde:
        from megatron_neobert.embeddings.cde import CDEEncoder

        model = CDEEncoder(args.model, context_size=args.cde_context_size, tasks=tasks, **common)
    else:
        model = NeoBERTEncoder(args.model, **common)
    summary = run_mteb(model, tasks, args.output, cache_dir=args.cache, overwrite=args.overwrite,
                       encode_batch_size=args.batch_size)
    print((Path(args.output) / "summary.md").read_text())
    return summary


if __name__ == "__main__":
    main()
