r"""Convert NeoBERT checkpoints between megatron-core (distributed, any TP/PP/VPP) and Hugging Face.

    # a trainer checkpoint (root or iter_XXXXXXX folder) -> HF folder, bf16 weights
    neobert-convert-checkpoint --direction mcore-to-hf --load runs/neobert/ckpt \
        --save exports/neobert-hf --dtype bf16 --model-preset neobert-250m

    # the published model -> a TP=2 x PP=2 checkpoint the trainer can --load
    neobert-convert-checkpoint --direction hf-to-mcore --load chandar-lab/NeoBERT \
        --save ckpt/neobert-tp2pp2 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2

Run it as one process (not under torchrun): the HF -> Megatron direction spawns its own ranks.
"""

import dataclasses
import sys
from typing import Optional

from megatron_neobert.cli import ProgressFlag, console_logging, megatron_runtime
from megatron_neobert.defaults import CONVERSION_DTYPES
from megatron_neobert.flags import ArgumentParser, add_flags, setting
from megatron_neobert.model import PRESETS


@dataclasses.dataclass(frozen=True)
class ConvertFlags:
    direction: Optional[str] = setting(None, "which way to convert", choices=["mcore-to-hf", "hf-to-mcore"],
                                       required=True)
    load: Optional[str] = setting(
        None, "mcore-to-hf: checkpoint root or iteration folder; hf-to-mcore: HF folder or hub name", required=True)
    save: Optional[str] = setting(None, "the folder to create (refused if it exists, see --overwrite)",
                                  required=True)
    tensor_model_parallel_size: Optional[int] = setting(None, "hf-to-mcore: TP of the written checkpoint "
                                                              "(default: 1)")
    pipeline_model_parallel_size: Optional[int] = setting(None, "hf-to-mcore: PP of the written checkpoint "
                                                                "(default: 1)")
    dtype: str = setting("fp32", "dtype of the written weights", choices=CONVERSION_DTYPES)
    tokenizer: Optional[str] = setting(
        None, "HF tokenizer folder or name. mcore-to-hf: copied into the export (default: the one the checkpoint "
              "was trained with); hf-to-mcore: recorded in the checkpoint args (default: the source's)")
    no_tokenizer: bool = setting(
        False, "mcore-to-hf: export without tokenizer files (otherwise a missing tokenizer is an error)")
    model_preset: Optional[str] = setting(None, "fail unless the weights have this preset's architecture",
                                          choices=sorted(PRESETS))
    make_vocab_size_divisible_by: int = setting(128, "hf-to-mcore: vocabulary padding multiple (times TP), as the "
                                                     "trainer's")
    overwrite: bool = setting(False, "replace an existing --save")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    add_flags(p, ConvertFlags)
    add_flags(p, ProgressFlag)
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.direction == "mcore-to-hf" and (args.tensor_model_parallel_size or args.pipeline_model_parallel_size):
        p.error("--tensor/--pipeline-model-parallel-size are for hf-to-mcore: a distributed checkpoint "
                "is read from any layout")
    return args


@console_logging("%(levelname)s %(name)s: %(message)s")
def main(argv=None) -> int:
    args = parse_args(argv)
    from megatron_neobert.progress import library_bars

    library_bars(not args.no_progress)
    with megatron_runtime():
        from megatron_neobert.conversion.convert import ConversionError

        try:
            summary = _convert(args)
        except (ConversionError, FileExistsError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    print(summary)
    return 0


def _convert(args) -> str:
    from megatron_neobert.conversion.convert import hf_to_mcore, mcore_to_hf

    if args.direction == "mcore-to-hf":
        return mcore_to_hf(args.load, args.save, dtype=args.dtype, tokenizer=args.tokenizer,
                           model_preset=args.model_preset, overwrite=args.overwrite,
                           progress=not args.no_progress, no_tokenizer=args.no_tokenizer)
    return hf_to_mcore(args.load, args.save, args.tensor_model_parallel_size or 1,
                       args.pipeline_model_parallel_size or 1, dtype=args.dtype,
                       tokenizer=args.tokenizer, model_preset=args.model_preset,
                       overwrite=args.overwrite, progress=not args.no_progress,
                       make_vocab_size_divisible_by=args.make_vocab_size_divisible_by)
