class TrainingError(RuntimeError):
    """A fault the trainer explains in one line (raised alike on every rank): the entry point
    prints it without a traceback and exits with status 1."""


class InputError(TrainingError, ValueError):
    """Bad input (a flag, a file, a checkpoint of another model), found before training starts. A
    ValueError too, which the tools report in one line as well."""
