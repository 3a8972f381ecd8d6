"""MTEB (mteb 2.x) evaluation of an exported NeoBERT embedding folder, with the paper's per-task instructions.

    neobert-run-mteb --model neobert-embed --output results/neobert-embed            # MTEB(eng, v1)
    neobert-run-mteb --model neobert-embed --output results/x --tasks STS12 NFCorpus --dtype bf16
    neobert-run-mteb --model cde-folder --cde --output results/cde --tasks SciFact
    # offline: tasks from local files (docs/mteb.md)
    neobert-run-mteb --model neobert-embed --output results/local --local-task data/NFCorpus data/my-sts

Writes summary.md / summary.json (by task type, beside the paper's numbers) and mteb's per-task results under
--cache (default <output>/mteb_cache), keyed by a revision hashed from the weights, config, dtype and instructions.
"""

import dataclasses
from pathlib import Path
from typing import List, Optional

from megatron_neobert.cli import DeviceFlag, console_logging, require_extra
from megatron_neobert.defaults import DEFAULT_BENCHMARK, DTYPE_NAMES
from megatron_neobert.flags import ArgumentParser, add_flags, setting


@dataclasses.dataclass(frozen=True)
class MTEBFlags:
    model: Optional[str] = setting(None, "exported NeoBERT folder (or a CDE folder with --cde)", required=True)
    output: Optional[str] = setting(None, "summary.md and summary.json go here", required=True)
    tasks: Optional[List[str]] = setting(
        None, f"MTEB task and/or benchmark names (default: {DEFAULT_BENCHMARK}, unless --local-task is given)")
    local_task: List[str] = setting([], "tasks from local files, no Hub needed: retrieval, STS or classification "
                                        "folders (docs/mteb.md gives the files)", action="extend", metavar="FOLDER")
    dtype: str = setting("float16", "the paper evaluates in float16", choices=sorted(DTYPE_NAMES))
    batch_size: int = setting(64, "texts per forward pass")
    max_length: Optional[int] = setting(None, "tokens per text (default: the model's maximum)")
    no_instructions: bool = setting(False, "encode queries without the paper's instructions")
    name: Optional[str] = setting(None, "model name in mteb's cache (default: the folder name)")
    cache: Optional[str] = setting(None, "mteb's result cache (default: <output>/mteb_cache)")
    overwrite: bool = setting(False, "re-run tasks already in the cache")
    cde: bool = setting(False, "the folder is a contextual (CDE) model")
    cde_context_size: Optional[int] = setting(None, "context documents per task (default: the J it was trained "
                                                    "with)")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    add_flags(p, MTEBFlags)
    add_flags(p, DeviceFlag)
    return p


@console_logging("%(asctime)s %(levelname)s %(message)s")
def main(argv=None, tasks=None):
    """`tasks` (task objects) replaces --tasks and --local-task."""
    args = build_parser().parse_args(argv)
    require_extra("eval", "neobert-run-mteb", ("mteb", "datasets"))  # local tasks are datasets' Datasets too
    from megatron_neobert.embeddings.mteb_eval import MTEBTaskError, NeoBERTEncoder, resolve_tasks, run_mteb
    from megatron_neobert.embeddings.mteb_local import local_task
    from megatron_neobert.model_source import check_model_source

    try:
        if not args.cde:  # a CDE folder holds two model folders, which load_cde checks
            check_model_source(args.model, hub=False)
        if tasks is None:
            names = args.tasks if args.tasks is not None else ([] if args.local_task else [DEFAULT_BENCHMARK])
            tasks = [local_task(folder) for folder in args.local_task] + (resolve_tasks(names) if names else [])
        common = dict(dtype=args.dtype, device=args.device, batch_size=args.batch_size, max_length=args.max_length,
                      use_instructions=not args.no_instructions, name=args.name)
        if args.cde:
            from megatron_neobert.embeddings.cde import CDEEncoder

            model = CDEEncoder(args.model, context_size=args.cde_context_size, tasks=tasks, **common)
        else:
            model = NeoBERTEncoder(args.model, **common)
    except (ValueError, FileNotFoundError) as err:  # unknown task names, a bad task file or model folder
        raise SystemExit(f"error: {err}") from None
    try:
        summary = run_mteb(model, tasks, args.output, cache_dir=args.cache, overwrite=args.overwrite,
                           encode_batch_size=args.batch_size, model_name=args.name or args.model)
    except MTEBTaskError as err:  # the summary of the tasks that finished is written
        raise SystemExit(f"error: {err}") from None
    print((Path(args.output) / "summary.md").read_text())
    return summary


def cli() -> None:
    """The neobert-run-mteb command: main()'s results are printed and written, not its exit status."""
    main()
