"""The global batch of each step: fixed, or growing with Megatron-LM's --rampup-batch-size START INCREMENT SAMPLES,
on megatron-core's micro-batch calculator (the loop's, and the count of a ramped run's iterations), with every size
checked against micro-batch x data-parallel size before training."""

from megatron_neobert.errors import InputError


def rampup_train_iters(training) -> int:
    """The iterations of a --train-samples run whose batch grows (`training`: its TrainingSettings), counted as
    Megatron-LM's update_train_iters counts them: steps of the ramp while the samples before them are within the
    ramp (and --train-samples), then whole global batches; the ramp itself checked as megatron-core's calculator
    checks it."""
    gbs, samples = training.global_batch_size, training.train_samples
    start, increment, ramp = training.rampup_batch_size
    flag = f"--rampup-batch-size {start} {increment} {ramp}"
    if start < 1 or increment < 1 or ramp < 1:  # megatron-core divides by SAMPLES
        raise InputError(f"{flag}: START, INCREMENT and SAMPLES must be at least 1")
    if start >= gbs:
        raise InputError(f"{flag}: START must be below --global-batch-size {gbs}, where the ramp ends")
    if (gbs - start) % increment:
        raise InputError(f"{flag}: --global-batch-size {gbs} - START {start} must be a multiple of INCREMENT "
                         f"{increment}")
    from megatron_neobert.kernels import TransformerEngineInstallError, import_megatron_core

    try:  # megatron-core's calculator counts the ramp, as in the loop; the entry point has not imported it yet
        import_megatron_core()
    except TransformerEngineInstallError as err:
        raise InputError(str(err)) from err
    from megatron_neobert.megatron_core_compat import micro_batch_calculator

    sizes = micro_batch_calculator(gbs, training.rampup_batch_size, micro_batch_size=1, data_parallel_size=1)
    iterations = consumed = 0
    while consumed <= ramp and consumed <= samples:
        sizes.update(consumed, consistency_check=False)
        consumed += sizes.get_current_global_batch_size()
        iterations += 1
    return iterations + max(0, samples - consumed) // gbs


def check_batch_sizes(training, data_parallel_size: int) -> None:
    """Every global batch size of the run (each of its ramp with --rampup-batch-size) a multiple of micro-batch x
    data-parallel size, as megatron-core's calculator requires; checked before training (megatron-core asserts at
    the step that reaches a size that is not)."""
    gbs, mbs, ramp = training.global_batch_size, training.micro_batch_size, training.rampup_batch_size
    per_step = mbs * data_parallel_size
    sizes = [gbs] if ramp is None else list(range(ramp[0], gbs + 1, ramp[1]))
    bad = [size for size in sizes if size % per_step]
    if not bad:
        return
    what = (f"--global-batch-size {gbs}" if ramp is None else
            f"--rampup-batch-size {' '.join(map(str, ramp))}: global batch size {bad[0]} of the ramp "
            f"({', '.join(map(str, sizes))})")
    raise InputError(f"{what} is not a multiple of --micro-batch-size {mbs} x data-parallel size {data_parallel_size}")
