#!/usr/bin/env python
"""Contextual Document Embeddings (CDE) training with NeoBERT stages: k-means pseudo-context batches, a first
stage that embeds J context documents, a second stage that reads them before the document tokens.

    python tools/finetune_cde.py --model neobert-hf --output neobert-cde \
        --dataset msmarco=data/msmarco.jsonl --batch-size 512 --context-size 512 --chunk-size 32

The output holds first_stage/, second_stage/, the context projection and cde_config.json; load it with
megatron_neobert.embeddings.cde.load_cde and evaluate with tools/run_mteb.py --cde.
"""

import argparse
import logging
import sys
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_neobert.embeddings.cde import CDEConfig, finetune_cde  # noqa: E402
from megatron_neobert.embeddings.data import load_pair_dataset, parse_dataset_spec  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="exported NeoBERT folder for the first stage (and the second)")
    p.add_argument("--second-stage-model", default=None, help="a different folder for the second stage")
    p.add_argument("--output", required=True)
    p.add_argument("--dataset", action="append", required=True, metavar="[NAME=]SOURCE")
    p.add_argument("--split", default="train")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--device", default=None)
    for f in fields(CDEConfig):
        if f.name == "bf16":
            p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None)
        else:
            p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    datasets = []
    for spec in args.dataset:
        name, source = parse_dataset_spec(spec)
        datasets.append(load_pair_dataset(source, name=name, split=args.split, max_negatives=0))
    config = CDEConfig(**{f.name: getattr(args, f.name) for f in fields(CDEConfig)})
    return finetune_cde(args.model, datasets, args.output, config, second_dir=args.second_stage_model,
                        device=args.device, checkpoint_dir=args.checkpoint_dir)


if __name__ == "__main__":
    main()
