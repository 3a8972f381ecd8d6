"""Unified contrastive fine-tuning of an exported NeoBERT folder into a sentence-transformers embedding model.

    neobert-finetune-contrastive --model neobert-hf --output neobert-embed \
        --dataset msmarco=data/msmarco.jsonl --dataset allnli=sentence-transformers/all-nli:triplet \
        --steps 2000 --batch-size 128 --chunk-size 32

Each --dataset is [NAME=]SOURCE, SOURCE a .jsonl/.parquet file or a hub dataset (owner/name[:config]); NAME picks
the paper's instruction from megatron_neobert/assets/instructions.json unless --instruction NAME=TEXT overrides it.
"""

import logging

from megatron_neobert.flags import ArgumentParser, add_flags


def build_parser() -> ArgumentParser:
    from megatron_neobert.embeddings.config import ContrastiveConfig

    p = ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="exported NeoBERT HF folder")
    p.add_argument("--output", required=True, help="folder to write (replaced atomically)")
    p.add_argument("--dataset", action="append", required=True, metavar="[NAME=]SOURCE",
                   help="training pairs: a .jsonl/.parquet file (docs/embeddings.md gives the fields) or a hub "
                        "dataset owner/name[:config]; repeat for a mixture")
    p.add_argument("--instruction", action="append", default=[], metavar="NAME=TEXT",
                   help="instruction for dataset NAME (an empty TEXT means none)")
    p.add_argument("--split", default="train", help="split of hub datasets")
    p.add_argument("--max-negatives", type=int, default=None, help="hard negatives kept per query (default: all)")
    p.add_argument("--checkpoint-dir", default=None, help="default: <output>-checkpoints")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    add_flags(p, ContrastiveConfig)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    from megatron_neobert.embeddings.data import load_pair_dataset, parse_dataset_spec
    from megatron_neobert.embeddings.config import ContrastiveConfig
    from megatron_neobert.embeddings.finetune import finetune_contrastive
    from megatron_neobert.model_source import check_model_source

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
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
    out = finetune_contrastive(args.model, datasets, args.output, config, device=args.device,
                               checkpoint_dir=args.checkpoint_dir)
    logging.info("wrote %s", out)
    return out


def cli() -> None:
    """The neobert-finetune-contrastive command: main()'s results are printed and written, not its exit status."""
    main()
