r"""The trainer flags of stage 2 from a stage-1 checkpoint, as shell assignments for
examples/pretrain_neobert_stage2.sh to `eval` (`megatron_neobert.training.config.stage2`: what stage 2 takes from
stage 1).

    python -m megatron_neobert.cli.stage2_plan --stage1 ckpt/stage1 --save ckpt/stage2
"""

import dataclasses
import shlex
import sys
from typing import List, Optional

from megatron_neobert.flags import ArgumentParser, add_flags, setting


@dataclasses.dataclass(frozen=True)
class Stage2Flags:
    stage1: Optional[str] = setting(None, "stage 1's checkpoint root (its --save)", required=True)
    save: Optional[str] = setting(None, "stage 2's checkpoint root", required=True)
    load_optim: int = setting(1, "1: go on with stage 1's optimizer state and schedule; 0: its weights only",
                              choices=[0, 1])
    seq_length: Optional[int] = setting(None, "default: 4 x stage 1's")
    iters: Optional[int] = setting(None, "stage 2's steps (default: stage 1's iterations / 20)")
    data_path: Optional[List[str]] = setting(None, "default: stage 1's --data-path")


def main(argv=None) -> int:
    """Prints RANKS=... and STAGE2_FLAGS=(...) for the script to `eval`; a bad checkpoint is one `error:` line."""
    p = ArgumentParser(prog="python -m megatron_neobert.cli.stage2_plan", description=__doc__)
    add_flags(p, Stage2Flags)
    args = p.parse_args(argv)
    from megatron_neobert.training.config.stage2 import stage2_plan

    try:
        plan = stage2_plan(args.stage1, args.save, bool(args.load_optim), args.seq_length, args.iters, args.data_path)
    except (OSError, ValueError) as err:  # no checkpoint there, not the trainer's, samples-based
        print(f"error: --stage1 {args.stage1}: {err}", file=sys.stderr)
        return 1
    print(plan.summary, file=sys.stderr)
    print(f"RANKS={plan.ranks}")
    print(f"STAGE2_FLAGS=({shlex.join(plan.flags)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
