"""The loader's fixed-length list of masked positions."""

import torch

from megatron_neobert.data.datasets.batches import collate_mlm_batch, masked_list_capacity


def sample(labels):
    labels = torch.tensor(labels)
    return {"tokens": torch.where(labels == -100, 1, labels), "labels": labels}


def test_one_length_for_every_batch_of_a_run_and_the_positions_in_order():
    g = torch.Generator().manual_seed(0)
    lengths = set()
    for _ in range(20):
        labels = torch.where(torch.rand(4, 256, generator=g) < 0.2, 7, -100)
        batch = collate_mlm_batch([sample(row.tolist()) for row in labels], mask_rate=0.2)
        count = int(batch["num_masked"])
        assert count == int((labels != -100).sum())
        assert batch["masked_positions"][:count].tolist() == (labels.reshape(-1) != -100).nonzero().squeeze(1).tolist()
        assert (batch["masked_positions"][count:] == 0).all()
        lengths.add(batch["masked_positions"].shape[0])
    assert lengths == {masked_list_capacity(4 * 256, 0.2)}
    # Room above the mean; at a real batch (32 x 1024 tokens) little of the head's work is padding.
    assert 0.2 * 1024 < masked_list_capacity(1024, 0.2) < 1024
    assert 0.2 * 32768 < masked_list_capacity(32768, 0.2) < 0.22 * 32768


def test_a_batch_beyond_the_length_gets_a_longer_list_never_a_cut_one():
    batch = collate_mlm_batch([sample([5] * 200 + [-100] * 56)], mask_rate=0.2)
    assert int(batch["num_masked"]) == 200 and batch["masked_positions"].shape[0] == 256
    assert batch["masked_positions"][:200].tolist() == list(range(200))


def test_without_a_mask_rate_the_list_is_exact():
    batch = collate_mlm_batch([sample([-100, 9, -100, 4]), sample([3, -100, -100, -100])])
    assert batch["masked_positions"].tolist() == [1, 3, 4] and int(batch["num_masked"]) == 3
