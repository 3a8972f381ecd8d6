"""One optimizer step over a global batch: megatron-core's schedule runs forward and backward over its micro-batches on
every model chunk, DDP reduces the gradients (calculate_per_token_loss: divided once by the global number of masked
tokens), and the optimizer steps unless the loss or a gradient is not finite. `TrainState` is where the run is."""

import dataclasses
import logging
import math
from typing import List, Optional

from megatron.core import parallel_state
from megatron.core.optimizer_param_scheduler import get_canonical_lr_for_logging

from megatron_neobert.errors import TrainingError
from megatron_neobert.training.config.settings import Settings
from megatron_neobert.training.engine.forward_step import ForwardStep, grads_are_finite, params_norm, run_micro_batches

logger = logging.getLogger(__name__)


class NonFiniteLossError(TrainingError):
    pass


@dataclasses.dataclass
class TrainState:
    """Where the run is; what a checkpoint's "train_state" restores."""

    iteration: int = 0
    consumed_samples: int = 0  # training samples read, over all data-parallel ranks
    skipped_iters: int = 0  # steps skipped for a non-finite loss or gradient, in total
    skipped_in_a_row: int = 0
    last_checkpoint: Optional[str] = None  # the iteration folder last saved or loaded
    floating_point_operations: float = 0.0  # training FLOPs so far, all ranks (Megatron-LM's count)


def fp16_step(optimizer, state: TrainState) -> tuple:
    """(stepped, grad norm, zeros in the gradient) with --fp16: megatron-core's loss scaler finds overflows,
    skips the step and lowers the scale; such skips are routine (the scale starts high) and do not stop the run."""
    ok, grad_norm, num_zeros = optimizer.step()
    if not ok:
        state.skipped_iters += 1
    return ok, grad_norm, num_zeros


def train_step(settings: Settings, chunks, optimizer, scheduler, batches: List[dict], state: TrainState,
               forward_step: ForwardStep, pad_id: int) -> dict:
    """One optimizer step over a global batch; updates `state` and returns the step's record:
    iteration, loss, accuracy, lr (used by that step), logged_lr (the next step's, as Megatron-LM logs
    it), grad_norm, skipped, predicted, tokens, global_batch_size, loss_scale (None without --fp16), num_zeros
    (with --log-num-zeros-in-grad), params_norm (with --log-params-norm)."""
    for c in chunks:
        c.zero_grad_buffer()
    optimizer.zero_grad()
    lr = optimizer.param_groups[0]["lr"]
    stats = run_micro_batches(chunks, batches, forward_only=False, forward_step=forward_step, pad_id=pad_id)
    state.iteration += 1
    fp16 = settings.precision.fp16
    # As Megatron-LM: the step's samples are its micro-batches x micro-batch size x DP (fewer during a batch ramp).
    global_batch = len(batches) * settings.training.micro_batch_size * parallel_state.get_data_parallel_world_size()
    state.consumed_samples += global_batch
    loss_scale = float(optimizer.get_loss_scale()) if fp16 else None
    stepped, num_zeros = False, None
    if math.isfinite(stats.loss) and fp16:
        stepped, grad_norm, num_zeros = fp16_step(optimizer, state)
        state.skipped_in_a_row = 0
    elif math.isfinite(stats.loss) and grads_are_finite(chunks):
        stepped, grad_norm, num_zeros = optimizer.step()
        if not stepped:
            raise TrainingError(f"iteration {state.iteration}: megatron-core's optimizer skipped the step for a "
                                f"non-finite gradient that the finite check before it did not see")
        state.skipped_in_a_row = 0
    else:
        grad_norm = float("nan")
        state.skipped_in_a_row += 1
        state.skipped_iters += 1
        logger.info(f"iteration {state.iteration}: non-finite loss or gradient, step skipped "
                    f"({state.skipped_in_a_row} in a row, {state.skipped_iters} in total)")
        if state.skipped_in_a_row > settings.faults.max_skipped_iters:
            raise NonFiniteLossError(
                f"{state.skipped_in_a_row} consecutive steps with a non-finite loss or gradient (more than "
                f"--max-skipped-iters {settings.faults.max_skipped_iters}); stopping at iteration "
                f"{state.iteration} without saving. Last good checkpoint: {state.last_checkpoint or 'none'}")
    if stepped:  # the scheduler counts samples, as Megatron-LM's
        scheduler.step(increment=global_batch)
    # Megatron-LM logs the lr after the scheduler's step (the next step's), that of the default param group.
    logged_lr = get_canonical_lr_for_logging(optimizer.param_groups)
    return dict(iteration=state.iteration, loss=stats.loss, accuracy=stats.accuracy, lr=lr,
                logged_lr=optimizer.param_groups[0]["lr"] if logged_lr is None else logged_lr,
                grad_norm=float(grad_norm) if grad_norm is not None else None,
                skipped=not stepped, predicted=stats.predicted, tokens=stats.real_tokens,
                attended=stats.attended_pairs, consumed_samples=state.consumed_samples, global_batch_size=global_batch,
                loss_scale=loss_scale,
                num_zeros=num_zeros, params_norm=params_norm(chunks) if settings.logging.log_params_norm else None)
