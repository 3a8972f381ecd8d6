"""Pre-train NeoBERT with megatron-core (the entry point, as Megatron-LM's pretrain_bert.py).

    torchrun --nproc-per-node 8 -m megatron_neobert.pretrain --data-path data/refinedweb_content_document \
        --tokenizer-model bert-base-uncased --bf16 --use-distributed-optimizer --save ckpt --load ckpt

The loop, its set-up and its checkpoints are in `megatron_neobert.training`; as a library:
`megatron_neobert.training.engine.entry.train(parse_settings(argv))`.
"""

import logging
import os
import time
import traceback
from typing import List, Optional

from megatron_neobert.cli import logging_kept
from megatron_neobert.errors import HostError, TrainingError

RANK_0_GRACE_S = 30  # seconds

# By its package name: run as `python -m megatron_neobert.pretrain` (torchrun) this module is __main__, whose
# logger is outside the package's and would drop INFO lines such as the closing "done: iteration N".
logger = logging.getLogger("megatron_neobert.pretrain")


@logging_kept()  # called in-process, the run takes the trainer's console (configure_logging) with it
def main(argv: Optional[List[str]] = None, launcher=None) -> int:
    """`launcher`: the command line's `LauncherWatch`, started before these imports (else the run starts its own)."""
    from megatron_neobert.training.reporting.goodput import GoodputAccount

    account = GoodputAccount.from_launch()  # from SLURM's or the launcher's start, else the process's
    account.lap("Python and the entry point")
    from megatron_neobert.training.config.arguments import parse_settings

    try:
        settings = parse_settings(argv)  # --help and bad flags answer here, before megatron-core is imported
        from megatron_neobert.parallel.launch import check_gpus_for_training  # with torch: after --help

        check_gpus_for_training()
    except TrainingError as err:  # before any process group, every rank alike: rank 0 says it
        return _report(err)
    account.lap("settings (with torch's import)")
    from megatron_neobert.kernels import TransformerEngineInstallError, import_megatron_core
    from megatron_neobert.training.reporting.train_log import configure_logging

    configure_logging()  # before megatron-core's import, whose warnings it shows
    try:
        import_megatron_core()
    except TransformerEngineInstallError as err:
        return _report(err)
    account.lap("megatron-core's import")
    from megatron_neobert.parallel.cpu import cpu_execution
    from megatron_neobert.training.engine.entry import train
    from megatron_neobert.training.resilience.guards.children import kill_children, kill_stopped_local_ranks

    account.lap("the trainer's modules")
    try:
        with cpu_execution():
            history = train(settings, account=account, launcher=launcher)
    except HostError as err:  # raised on one host's ranks: each says it
        kill_children()
        _report_rank_error(err)
        return 1
    except TrainingError as err:  # raised alike on every rank: rank 0 says it
        kill_children()
        return _report(err)
    except BaseException as err:  # this rank's alone (its data, a lost peer, a bug): it says it
        kill_children()
        traceback.print_exc()
        _report_rank_error(err)
        kill_stopped_local_ranks()
        return 1
    logger.info(f"done: iteration {history['iteration']} ({history['exit']})")  # the run destroyed its groups
    return 0


def _report(err: Exception) -> int:
    """One line on rank 0 (the launcher's RANK while no process group exists: the input checks
    run before it), status 1 on every rank."""
    import torch

    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else int(os.environ.get("RANK", 0))
    if rank == 0:
        from megatron_neobert.training.resilience.guards.launcher import say_error

        say_error(f"error: {err}")
    else:
        # The launcher stops every rank as soon as one exits: give rank 0, which meets the same
        # fault, the time to say it (its exit ends this wait).
        time.sleep(RANK_0_GRACE_S)
    return 1


def _report_rank_error(err: BaseException) -> None:
    from megatron_neobert.training.resilience.guards.launcher import say_error

    say_error(f"error: rank {os.environ.get('RANK', '0')}: {error_line(err)}")


def error_line(err: BaseException) -> str:
    """What went wrong, in one line: an error a DataLoader worker raised comes back as "Caught X in
    DataLoader worker process N" followed by the worker's traceback, whose last line says it."""
    lines = str(err).strip().splitlines()
    if isinstance(err, HostError):
        return lines[0]
    if len(lines) > 1 and lines[1].startswith("Original Traceback"):
        return lines[-1]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def cli() -> None:
    """The command line: ends the process with main()'s status at once (`exit_now`: Python's own exit
    could wait forever on a DataLoader worker, or on a process group whose peer is gone)."""
    from megatron_neobert.training.resilience.guards.children import exit_now
    from megatron_neobert.training.resilience.guards.launcher import LauncherWatch

    # First: a rank must not outlive a torchrun that dies while it imports and meets the others.
    launcher = LauncherWatch()
    try:
        status = main(launcher=launcher)
    except SystemExit:  # --help and the parser's usage errors, with their own status, before any worker exists
        raise
    except BaseException as err:  # raised while main() handled the first error: a DataLoader worker's death
        _report_rank_error(err)  # signalled meanwhile (torch's handler raises wherever the main thread is)
        status = 1
    exit_now(status)


if __name__ == "__main__":
    cli()
