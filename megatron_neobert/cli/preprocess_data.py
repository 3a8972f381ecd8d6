r"""Tokenize RefinedWeb-style data into megatron-core .bin/.idx files (Megatron-LM's flag names).

    neobert-preprocess-data --input 'refinedweb/*.parquet' --output-prefix data/refinedweb \
        --json-keys content --tokenizer-type HuggingFaceTokenizer --tokenizer-model bert-base-uncased --workers 16

writes data/refinedweb_content_document.bin/.idx (one whole document per sequence, one document
per input record) and data/refinedweb_content_document.tokenizer.json. Each input file is first
written as a shard in data/refinedweb_shards/; a killed run started again skips complete shards.

With --split-sentences (as Megatron-LM's: NLTK punkt; the data extra, pip install ".[data]", and
python -m nltk.downloader punkt_tab), each sentence is one sequence of its document and the
output is data/refinedweb_content_sentence.bin/.idx.

Across nodes, each rank takes every world_size-th file and writes shards only; merge them after:

    # SLURM job array (rank/world size from SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT)
    sbatch --array=0-63 --wrap "neobert-preprocess-data --input 'rw/*.parquet' \
        --json-keys content --output-prefix data/rw --workers 32"
    # torchrun (rank/world size from RANK / WORLD_SIZE)
    torchrun --nnodes 8 --nproc-per-node 1 ... --no-python neobert-preprocess-data --input 'rw/*.parquet' \
        --json-keys content --output-prefix data/rw --workers 32
    # then, once per key (each rank prints these commands):
    neobert-merge-datasets --shard-dir data/rw_shards --json-key content \
        --output-prefix data/rw_content_document
"""

import dataclasses
import os
import sys
from typing import List, Optional

from megatron_neobert.cli import ProgressFlag, console_logging, import_megatron_core_quietly, require_extra
from megatron_neobert.data.preprocessing.preprocess_settings import (InputSettings, OutputSettings, PreprocessSettings,
                                                       PreprocessTokenizerSettings, RuntimeSettings)
from megatron_neobert.data.tokenizer import NULL_TOKENIZER, TokenizerSettings, resolve_tokenizer_flags
from megatron_neobert.flags import ArgumentParser, add_flags, parse_given, setting, with_defaults


# The command's own flags: what preprocess_data takes besides its settings.
@dataclasses.dataclass(frozen=True)
class InputFiles:
    input: Optional[List[str]] = setting(
        None, "Parquet / JSON lines (.gz, .zst) files, globs, folders, or a folder saved by datasets.save_to_disk; "
              "each file is one shard", required=True)


@dataclasses.dataclass(frozen=True)
class OutputFiles:
    output_prefix: Optional[str] = setting(
        None, "writes {prefix}_{key}_document.bin/.idx per --json-keys key (_sentence with --split-sentences)",
        required=True)


def rank_from_environment():
    """(rank, world size) of a SLURM job array task or a torchrun process, else (0, 1)."""
    env = os.environ
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        first = int(env.get("SLURM_ARRAY_TASK_MIN", 0))
        return int(env["SLURM_ARRAY_TASK_ID"]) - first, int(env["SLURM_ARRAY_TASK_COUNT"])
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"])
    return 0, 1


SECTIONS = {"input data": (InputFiles, InputSettings), "tokenizer": (PreprocessTokenizerSettings,),
            "output data": (OutputFiles, OutputSettings), "runtime": (RuntimeSettings, ProgressFlag)}


def get_args(argv=None) -> dict:
    """The flags the command line gives, checked, the tokenizer's as resolved and the rank from the environment
    where not given: {dest: value}."""
    parser = ArgumentParser(description=__doc__)
    for title, sections in SECTIONS.items():
        group = parser.add_argument_group(title)
        for section in sections:
            add_flags(group, section)
    given = parse_given(parser, argv)
    args = with_defaults(parser, given)
    for flag, dest in (("--keep-newlines", "keep_newlines"), ("--lang", "lang")):
        if dest in given and not args.split_sentences:
            parser.error(f"{flag} only applies to sentence splitting: add --split-sentences, or "
                         f"drop {flag}")
    if args.tokenizer_type == NULL_TOKENIZER:
        parser.error("--tokenizer-type NullTokenizer takes already tokenized data's ids as they are, at training: "
                     "there is no text for it to tokenize here")
    tokenizer = {f.name: getattr(args, f.name) for f in dataclasses.fields(TokenizerSettings)}
    try:
        given.update(resolve_tokenizer_flags(tokenizer, given))
    except ValueError as err:
        parser.error(str(err))
    env_rank, env_world = rank_from_environment()
    given.setdefault("rank", env_rank)
    given.setdefault("world_size", env_world)
    return given


@console_logging("%(levelname)s %(message)s")
def main(argv=None) -> int:
    given = get_args(argv)
    if given.get("split_sentences"):  # before megatron-core's import and the inputs' reading
        require_extra("data", "--split-sentences")
    import_megatron_core_quietly()  # the data modules import megatron-core
    from megatron_neobert.data.preprocessing.preprocess import preprocess_data

    settings = {k: v for k, v in given.items() if k in {f.name for f in dataclasses.fields(PreprocessSettings)}}
    try:
        stats = preprocess_data(given["input"], given["output_prefix"], progress=not given.get("no_progress"),
                                **settings)
    except ValueError as err:  # DataInputError, IndexedDataError, tokenizer errors, empty input
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: complete shards are kept, the output is untouched; run again to "
              "resume", file=sys.stderr)
        return 130
    print(f"done: {stats.summary()}")
    for key, prefix in stats.outputs.items():
        print(f"  {key}: {prefix}" + ("" if stats.world_size > 1 else ".bin / .idx"))
    return 0
