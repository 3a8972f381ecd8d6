"""Validation: the masked-LM loss and accuracy over --eval-iters global batches."""

import torch

from megatron_neobert.training.engine.model_setup import finish_param_sync, resume_param_sync
from megatron_neobert.training.engine.forward_step import ForwardStep, StepStats, mlm_forward_step, run_micro_batches


def evaluate(chunks, valid_iter, num_micro_batches: int, eval_iters: int,
             forward_step: ForwardStep = mlm_forward_step) -> StepStats:
    finish_param_sync(chunks)
    for c in chunks:
        c.eval()
    total = StepStats(0.0, 0.0, 0)
    with torch.no_grad():
        for _ in range(eval_iters):
            batches = [next(valid_iter) for _ in range(num_micro_batches)]
            total = total + run_micro_batches(chunks, batches, forward_only=True, forward_step=forward_step)
    for c in chunks:
        c.train()
    resume_param_sync(chunks)
    return total
