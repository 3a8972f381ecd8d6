"""The package's commands, one module each (`main(argv)`, installed as the neobert-* console scripts; setup.py
lists them). Their flags follow `megatron_neobert.flags`: dashed as Megatron-LM's (the underscore spellings are read
too), no abbreviations, every default shown in --help.

Kept free of heavy imports (torch, transformers, megatron-core) so that `--help` answers at once.
"""

import contextlib
import dataclasses
import functools
import logging
from typing import Optional, Sequence

from megatron_neobert import extras
from megatron_neobert.flags import setting


# Flags several commands take with one meaning, declared once; a command adds them with add_flags.
@dataclasses.dataclass(frozen=True)
class DeviceFlag:
    device: Optional[str] = setting(None, "default: cuda when available, else cpu")


@dataclasses.dataclass(frozen=True)
class ProgressFlag:
    no_progress: bool = setting(False, "no progress bar")


@dataclasses.dataclass(frozen=True)
class HubSplitFlag:
    split: str = setting("train", "split of hub datasets")


def require_extra(extra: str, command: str, modules: Optional[Sequence[str]] = None) -> None:
    """Ends `command` in one `error:` line naming the install when `extra`'s `modules` are missing
    (`extras.require_extra`), before the import that would end it in a traceback."""
    try:
        extras.require_extra(extra, command, modules)
    except extras.MissingExtra as err:
        raise SystemExit(f"error: {err}") from None


def import_megatron_core_quietly() -> None:
    """megatron-core imported by a command before the modules that import it, as the trainer imports it
    (`kernels.import_megatron_core`: a half-installed Transformer Engine named in one line, the warnings about each
    missing GPU extension silenced), and the one log line of the kernel paths that run said in their place."""
    from megatron_neobert.kernels import import_megatron_core

    import_megatron_core()
    from megatron_neobert.model.kernel_report import format_report, kernel_report  # imports megatron-core itself

    logging.getLogger(__name__).info(format_report(kernel_report()))


@contextlib.contextmanager
def megatron_runtime():
    """What a command that runs megatron-core sets up for its run: megatron-core imported quietly
    (`import_megatron_core_quietly`), and its CUDA calls on the CPU where there is no GPU
    (`parallel.cpu.cpu_execution`)."""
    import_megatron_core_quietly()
    from megatron_neobert.parallel.cpu import cpu_execution

    with cpu_execution():
        yield


@contextlib.contextmanager
def logging_kept():
    """The root and megatron_neobert loggers' levels and handlers as they were before the block, after it: a command
    called in-process (a test, a notebook) leaves no console handler and no INFO level behind, which would let the
    caller's later INFO lines through."""
    loggers = (logging.getLogger(), logging.getLogger("megatron_neobert"))
    saved = [(logger, logger.level, list(logger.handlers)) for logger in loggers]
    try:
        yield
    finally:
        for logger, level, handlers in saved:
            logger.setLevel(level)
            for handler in [h for h in logger.handlers if h not in handlers]:
                logger.removeHandler(handler)
                handler.close()


def console_logging(fmt: str):
    """Decorates a command's main: INFO lines on stderr as `fmt` while it runs (`logging.basicConfig`), and the
    logging configuration as it was once it returns (`logging_kept`)."""
    def decorate(main):
        @functools.wraps(main)
        def logged(*args, **kwargs):
            with logging_kept():
                logging.basicConfig(level=logging.INFO, format=fmt)
                return main(*args, **kwargs)
        return logged
    return decorate
