from typing import Sequence


class TrainingError(RuntimeError):
    """A fault the trainer explains in one line, or one line a problem (`one_line_each`), raised alike on every rank:
    the entry point prints it without a traceback and exits with status 1."""


class HostError(TrainingError):
    """A fault of this host's ranks alone, explained in one line: each rank that raises it says it (`error: rank R:
    ...`), not rank 0 for all, and exits with status 1."""


class InputError(TrainingError, ValueError):
    """Bad input (a flag, a file, a checkpoint of another model), found before training starts. A
    ValueError too, which the tools report in one line as well."""


def refuse(condition: bool, message: str) -> None:
    """Raise `InputError(message)` when `condition` holds: the settings' checks, one line each."""
    if condition:
        raise InputError(message)


def one_line_each(problems: Sequence[str]) -> str:
    """The message of an error with several problems: the entry points print `error: {message}`, so each problem
    gets its own `error:` line."""
    return "\nerror: ".join(problems)
