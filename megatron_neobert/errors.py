class TrainingError(RuntimeError):
    """A fault the trainer explains in one line (raised alike on every rank): the entry point
    prints it without a traceback and exits with status 1."""


class InputError(TrainingError, ValueError):
    """Bad input (a flag, a file, a checkpoint of another model), found before training starts. A
    ValueError too, which the tools report in one line as well."""


def refuse(condition: bool, message: str) -> None:
    """Raise `InputError(message)` when `condition` holds: the settings' checks, one line each."""
    if condition:
        raise InputError(message)
