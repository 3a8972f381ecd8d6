"""The command line becomes the run's settings once: frozen sections by concern, one `--help` group each, the
Namespace left as given; and the trainer's console (INFO lines from rank 0, warnings from every rank)."""

import dataclasses
import logging

import pytest
import torch

from megatron_neobert.training.arguments import build_parser, parse_command_line
from megatron_neobert.training.settings import SECTIONS, settings_from_args
from megatron_neobert.training.train_log import configure_logging

COMMAND_LINE_ONLY = {"help", "config"}


def test_each_help_group_is_one_settings_section():
    groups = {g.title: {a.dest for a in g._group_actions} for g in build_parser()._action_groups}
    for name, section in SECTIONS.items():
        assert groups[section.TITLE] == {f.name for f in dataclasses.fields(section)}, name
    in_sections = [f.name for section in SECTIONS.values() for f in dataclasses.fields(section)]
    assert len(in_sections) == len(set(in_sections))  # each flag in one section
    assert set(in_sections) == {a.dest for a in build_parser()._actions} - COMMAND_LINE_ONLY


def test_the_command_line_stays_as_given_and_the_settings_are_frozen(tmp_path):
    args, explicit = parse_command_line(["--data-path", "d", "--train-iters", "100", "--lr-warmup-iters", "0"])
    given = dict(vars(args))
    settings = settings_from_args(args, explicit)
    assert vars(args) == given and args.min_lr is None and args.bf16 is None  # resolved in the settings only
    assert (settings.training.min_lr, settings.training.lr_decay_iters, settings.precision.bf16) == (
        pytest.approx(6e-5), 90, False)
    assert settings.explicit == {"data_path", "train_iters", "lr_warmup_iters"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.training.lr = 1.0
    assert set(settings.flags()) == set(given) - {"config"}


def test_info_lines_show_from_rank_0_and_warnings_from_every_rank(monkeypatch, capsys):
    configure_logging()
    configure_logging()  # once per process: a second call adds no second console
    checkpoint_log = logging.getLogger("megatron_neobert.training.trainer_checkpoint")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setenv("RANK", "0")
    checkpoint_log.info("ckpt was saved with --no-save-rng: RNG states not restored")
    monkeypatch.setenv("RANK", "1")
    checkpoint_log.info("said by rank 1")
    checkpoint_log.warning("iteration folders are incomplete")
    logging.getLogger("megatron_neobert.training.profiling").info("rank 1's profile", extra={"every_rank": True})
    logging.getLogger("some_library").info("not ours")
    printed = capsys.readouterr()
    assert printed.out == "ckpt was saved with --no-save-rng: RNG states not restored\nrank 1's profile\n"
    assert printed.err == "WARNING megatron_neobert.training.trainer_checkpoint: iteration folders are incomplete\n"

