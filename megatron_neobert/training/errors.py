class TrainingError(RuntimeError):
    """A fault the trainer explains in one line (raised alike on every rank): the entry point
    prints it without a traceback and exits with status 1."""
