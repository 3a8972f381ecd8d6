r"""Unified contrastive fine-tuning of an exported NeoBERT folder into a sentence-transformers embedding model.

    neobert-finetune-contrastive --model neobert-hf --output neobert-embed \
        --dataset msmarco=data/msmarco.jsonl --dataset allnli=sentence-transformers/all-nli:triplet \
        --steps 2000 --batch-size 128 --chunk-size 32

Each --dataset is [NAME=]SOURCE, SOURCE a .jsonl/.parquet file or a hub dataset (owner/name[:config]); NAME picks
the paper's instruction from megatron_neobert/assets/instructions.json unless --instruction NAME=TEXT overrides it.
"""

import dataclasses
import logging
from typing import List, Optional

from megatron_neobert.cli import DeviceFlag, HubSplitFlag, console_logging
from megatron_neobert.embeddings.config import ContrastiveConfig
from megatron_neobert.flags import ArgumentParser, add_flags, setting


@dataclasses.dataclass(frozen=True)
class ContrastiveFlags:
    """The command's flags besides the training's (ContrastiveConfig)."""

    model: Optional[str] = setting(None, "exported NeoBERT HF folder", required=True)
    output: Optional[str] = setting(None, "folder to write (replaced atomically)", required=True)
    dataset: Optional[List[str]] = setting(
        None, "training pairs: a .jsonl/.parquet file (docs/embeddings.md gives the fields) or a hub dataset "
              "owner/name[:config]; repeat for a mixture", action="append", metavar="[NAME=]SOURCE", required=True)
    instruction: List[str] = setting([], "instruction for dataset NAME (an empty TEXT means none)",
                                     action="append", metavar="NAME=TEXT")
    max_negatives: Optional[int] = setting(None, "hard negatives kept per query (default: all)")
    checkpoint_dir: Optional[str] = setting(None, "default: <output>-checkpoints")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    add_flags(p, ContrastiveFlags)
    add_flags(p, HubSplitFlag)
    add_flags(p, DeviceFlag)
    add_flags(p, ContrastiveConfig)
    return p


@console_logging("%(asctime)s %(levelname)s %(message)s")
def main(argv=None):
    args = build_parser().parse_args(argv)
    from megatron_neobert.embeddings.data import load_pair_dataset, parse_dataset_spec
    from megatron_neobert.model_source import check_model_source

    try:  # the folder first: a mistyped one fails before the datasets are read
        check_model_source(args.model, hub=False)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    instructions = {}
    for item in args.instruction:
        name, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --instruction {item!r} must be NAME=TEXT")
        instructions[name.lower()] = text
    datasets = []
    for spec in args.dataset:
        try:
            name, source = parse_dataset_spec(spec)
            ds = load_pair_dataset(source, name=name, split=args.split, max_negatives=args.max_negatives)
        except (ValueError, FileNotFoundError) as err:  # a bad spec, file, line or record
            raise SystemExit(f"error: {err}") from None
        if ds.name.lower() in instructions:
            ds.instruction = instructions[ds.name.lower()] or None
        logging.info("dataset %s: %d pairs from %s; instruction: %r", ds.name, len(ds), ds.source, ds.instruction)
        datasets.append(ds)
    config = ContrastiveConfig(**{k: getattr(args, k) for k in vars(ContrastiveConfig())})
    from megatron_neobert.embeddings.finetune import finetune_contrastive  # torch: after the datasets' checks

    out = finetune_contrastive(args.model, datasets, args.output, config, device=args.device,
                               checkpoint_dir=args.checkpoint_dir)
    logging.info("wrote %s", out)
    return out


def cli() -> None:
    """The neobert-finetune-contrastive command: main()'s results are printed and written, not its exit status."""
    main()
