"""Convert NeoBERT checkpoints between megatron-core (distributed, any TP/PP/VPP) and Hugging Face.

    # a trainer checkpoint (root or iter_XXXXXXX folder) -> HF folder, bf16 weights
    neobert-convert-checkpoint --direction mcore-to-hf --load runs/neobert/ckpt \
        --save exports/neobert-hf --dtype bf16 --model-preset neobert-250m

    # the published model -> a TP=2 x PP=2 checkpoint the trainer can --load
    neobert-convert-checkpoint --direction hf-to-mcore --load chandar-lab/NeoBERT \
        --save ckpt/neobert-tp2pp2 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2

Run it as one process (not under torchrun): the HF -> Megatron direction spawns its own ranks.
"""

import logging
import sys

from megatron_neobert.cli import megatron_runtime
from megatron_neobert.flags import ArgumentParser


def build_parser() -> ArgumentParser:
    from megatron_neobert.defaults import CONVERSION_DTYPES
    from megatron_neobert.model import PRESETS

    p = ArgumentParser(description=__doc__)
    p.add_argument("--direction", required=True, choices=["mcore-to-hf", "hf-to-mcore"], help="which way to convert")
    p.add_argument("--load", required=True,
                   help="mcore-to-hf: checkpoint root or iteration folder; hf-to-mcore: HF folder or hub name")
    p.add_argument("--save", required=True, help="the folder to create (refused if it exists, see --overwrite)")
    p.add_argument("--tensor-model-parallel-size", type=int, default=None,
                   help="hf-to-mcore: TP of the written checkpoint (default: 1)")
    p.add_argument("--pipeline-model-parallel-size", type=int, default=None,
                   help="hf-to-mcore: PP of the written checkpoint (default: 1)")
    p.add_argument("--dtype", choices=CONVERSION_DTYPES, default="fp32", help="dtype of the written weights")
    p.add_argument("--tokenizer", default=None,
                   help="HF tokenizer folder or name. mcore-to-hf: copied into the export (default: the one "
                        "the checkpoint was trained with); hf-to-mcore: recorded in the checkpoint args "
                        "(default: the source's)")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="mcore-to-hf: export without tokenizer files (otherwise a missing tokenizer is an error)")
    p.add_argument("--model-preset", choices=sorted(PRESETS), default=None,
                   help="fail unless the weights have this preset's architecture")
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="hf-to-mcore: vocabulary padding multiple (times TP), as the trainer's")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --save")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.direction == "mcore-to-hf" and (args.tensor_model_parallel_size or args.pipeline_model_parallel_size):
        p.error("--tensor/--pipeline-model-parallel-size are for hf-to-mcore: a distributed checkpoint "
                "is read from any layout")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from megatron_neobert.progress import library_bars

    library_bars(not args.no_progress)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
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
