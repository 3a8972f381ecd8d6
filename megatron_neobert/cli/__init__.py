"""The package's commands, one module each (`main(argv)`, installed as the neobert-* console scripts; setup.py
lists them). Their flags follow `megatron_neobert.flags`: dashed as Megatron-LM's (the underscore spellings are read
too), no abbreviations, every default shown in --help.

Kept free of heavy imports (torch, transformers, megatron-core) so that `--help` answers at once.
"""

import contextlib


@contextlib.contextmanager
def megatron_runtime():
    """What a command that runs megatron-core sets up for its run: megatron-core imported with a half-installed
    Transformer Engine named in one line (`kernels.import_megatron_core`), and its CUDA calls on the CPU where there
    is no GPU (`parallel.cpu.cpu_execution`)."""
    from megatron_neobert.kernels import import_megatron_core

    import_megatron_core()
    from megatron_neobert.parallel.cpu import cpu_execution

    with cpu_execution():
        yield
