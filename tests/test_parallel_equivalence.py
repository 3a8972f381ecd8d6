"""Same weights, same global batch: loss and every gradient agree across parallel layouts.

Each layout runs on its own set of gloo ranks, loads the same TP=1 weights from a distributed
checkpoint and runs forward/backward through megatron-core's pipeline schedules and DDP; the reduced
gradients themselves are saved as a distributed checkpoint and read back at TP=1, where every tensor's
gradient is compared with the single-rank one (see parallel_cases.gradients).
"""

import pytest
import torch

from megatron_neobert.parallel.launch import run_on_ranks
from parallel_cases import Layout, gradients, read_full_state_dict, save_initial_weights
from shared_runs import run_once

pytestmark = pytest.mark.integration

SEQ, MICRO_BATCH, NUM_MICRO_BATCHES = 16, 2, 4


def make_batches(packed: bool):
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(NUM_MICRO_BATCHES):
        tokens = torch.randint(5, 256, (MICRO_BATCH, SEQ), generator=g)
        labels = torch.where(torch.rand(MICRO_BATCH, SEQ, generator=g) < 0.3, tokens, -100)
        if packed:  # documents of 5, 11 | 7, 9 tokens in the two rows
            batches.append(dict(tokens=tokens, labels=labels, max_seqlen=11,
                                cu_seqlens=torch.tensor([0, 5, 16, 23, 32], dtype=torch.int32)))
        else:
            mask = torch.ones(MICRO_BATCH, SEQ, dtype=torch.bool)
            mask[1, 12:] = False
            labels[~mask] = -100
            batches.append(dict(tokens=tokens, labels=labels, attention_mask=mask))
    return batches


@pytest.fixture(scope="module")
def initial_checkpoint(tmp_path_factory):
    """Saved once per session, as the references computed from it."""
    def save(folder):
        path = str(folder / "init")
        run_on_ranks(save_initial_weights, 1, path)
        return path
    return run_once(tmp_path_factory, "test_parallel_equivalence-initial", save)


def run_layout(layout: Layout, initial: str, tmp_path, packed: bool):
    out = str(tmp_path / "after")
    losses = run_on_ranks(gradients, layout.world_size, layout, initial, out, make_batches(packed),
                          MICRO_BATCH)
    losses = [l for l in losses if l is not None]
    assert len(set(losses)) == 1, f"last-stage ranks disagree on the loss: {losses}"
    return losses[0], run_on_ranks(read_full_state_dict, 1, out)[0]


def reference(initial: str, tmp_path_factory, packed: bool):
    """The single-rank (loss, gradients), once per session."""
    return run_once(tmp_path_factory, f"test_parallel_equivalence-reference-packed{packed}",
                    lambda folder: run_layout(Layout(), initial, folder, packed))


LAYOUTS = {
    "tp2": (Layout(tp=2), False),
    "pp2": (Layout(pp=2), False),
    "tp2xpp2": (Layout(tp=2, pp=2), False),
    "dp2-distributed-optimizer": (Layout(dp=2, distributed_optimizer=True), False),
    "pp2-vpp2": (Layout(pp=2, vpp=2), False),
    "tp2-sequence-parallel-packed": (Layout(tp=2, sequence_parallel=True), True),
    "pp2-packed": (Layout(pp=2), True),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_loss_and_gradients_match_single_rank(name, initial_checkpoint, tmp_path, tmp_path_factory):
    layout, packed = LAYOUTS[name]
    ref_loss, ref_grads = reference(initial_checkpoint, tmp_path_factory, packed)
    loss, grads = run_layout(layout, initial_checkpoint, tmp_path, packed)

    assert loss == pytest.approx(ref_loss, rel=1e-6, abs=1e-6)
    assert grads.keys() == ref_grads.keys()
    for key, ref in ref_grads.items():
        assert ref.abs().max() > 0, f"{key} got no gradient"
        # float32 sums in another order (split GEMMs, reductions): relative to the tensor's largest gradient
        torch.testing.assert_close(grads[key], ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item(), msg=key)
