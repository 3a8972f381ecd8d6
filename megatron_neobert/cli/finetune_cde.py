r"""Contextual Document Embeddings (CDE) training with NeoBERT stages: k-means pseudo-context batches, a first
stage that embeds J context documents, a second stage that reads them before the document tokens.

    neobert-finetune-cde --model neobert-hf --output neobert-cde \
        --dataset msmarco=data/msmarco.jsonl --batch-size 512 --context-size 512 --chunk-size 32

The output holds first_stage/, second_stage/, the context projection and cde_config.json; load it with
megatron_neobert.embeddings.cde.load_cde and evaluate with neobert-run-mteb --cde.
"""

import dataclasses
import logging
from dataclasses import fields
from typing import List, Optional

from megatron_neobert.cli import DeviceFlag, HubSplitFlag, console_logging, require_extra
from megatron_neobert.embeddings.config import CDEConfig
from megatron_neobert.flags import ArgumentParser, add_flags, setting


@dataclasses.dataclass(frozen=True)
class CDEFlags:
    """The command's flags besides the training's (CDEConfig)."""

    model: Optional[str] = setting(None, "exported NeoBERT folder for the first stage (and the second)",
                                   required=True)
    second_stage_model: Optional[str] = setting(None, "a different folder for the second stage")
    output: Optional[str] = setting(None, "CDE folder to write (replaced atomically)", required=True)
    dataset: Optional[List[str]] = setting(
        None, "query-document pairs: a .jsonl/.parquet file (docs/embeddings.md) or a hub dataset "
              "owner/name[:config]; repeat for a mixture", action="append", metavar="[NAME=]SOURCE", required=True)
    checkpoint_dir: Optional[str] = setting(None, "resumable checkpoints (default: <output>-checkpoints)")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    add_flags(p, CDEFlags)
    add_flags(p, HubSplitFlag)
    add_flags(p, DeviceFlag)
    add_flags(p, CDEConfig)
    return p


@console_logging("%(asctime)s %(levelname)s %(message)s")
def main(argv=None):
    args = build_parser().parse_args(argv)
    require_extra("eval", "neobert-finetune-cde", ("sklearn",))  # the pseudo-contexts' k-means
    from megatron_neobert.embeddings.data import load_pair_dataset, parse_dataset_spec
    from megatron_neobert.model_source import check_model_source

    try:  # the folders first: a mistyped one fails before the datasets are read
        check_model_source(args.model, hub=False)
        if args.second_stage_model:
            check_model_source(args.second_stage_model, "--second-stage-model", hub=False)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    datasets = []
    for spec in args.dataset:
        try:
            name, source = parse_dataset_spec(spec)
            datasets.append(load_pair_dataset(source, name=name, split=args.split, max_negatives=0))
        except (ValueError, FileNotFoundError) as err:  # a bad spec, file, line or record
            raise SystemExit(f"error: {err}") from None
    config = CDEConfig(**{f.name: getattr(args, f.name) for f in fields(CDEConfig)})
    from megatron_neobert.embeddings.cde import finetune_cde  # torch: after the datasets' checks

    out = finetune_cde(args.model, datasets, args.output, config, second_dir=args.second_stage_model,
                       device=args.device, checkpoint_dir=args.checkpoint_dir)
    logging.info("wrote %s", out)
    return out


def cli() -> None:
    """The neobert-finetune-cde command: main()'s results are printed and written, not its exit status."""
    main()
