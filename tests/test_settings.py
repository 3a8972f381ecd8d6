"""Each setting declared once (a dataclass field with its flag, help and default), the parser generated from the
declarations, the command line turned once into frozen sections by concern; Megatron-LM's flags that choose nothing
never become settings; and the trainer's console (INFO lines from rank 0, warnings from every rank)."""

import argparse
import dataclasses
import logging

import pytest
import torch

from megatron_neobert.flags import HelpFormatter, flag_of
from megatron_neobert.training.config.arguments import (ADAPTER_FLAGS, MegatronLMFlags, build_parser, given_values,
                                                        parse_settings)
from megatron_neobert.training.config.settings import SECTIONS, Settings, declared_fields
from megatron_neobert.training.reporting.train_log import configure_logging

COMMAND_LINE_ONLY = {"help", "config"}


def test_every_flag_is_declared_once_and_its_help_shows_its_default():
    declarations = list(declared_fields()) + list(dataclasses.fields(MegatronLMFlags))
    names = [f.name for f in declarations]
    assert len(names) == len(set(names))  # no setting in two sections, no adapter flag that is also a setting
    parser = build_parser()
    actions = [a for a in parser._actions if a.dest not in COMMAND_LINE_ONLY]
    assert sorted(a.dest for a in actions) == sorted(names)  # one flag per declaration, none besides
    by_dest = {a.dest: a for a in actions}
    help_text = " ".join(parser.format_help().split())
    for field in declarations:
        action = by_dest[field.name]
        assert flag_of(field) in action.option_strings and flag_of(field) in help_text
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        assert action.default == default, field.name
        if default not in (None, False, True):  # switches say their meaning; None means "derived": see the help
            assert f"(default: {default})" in HelpFormatter("x")._get_help_string(action) % vars(action), field.name
    groups = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    for section in SECTIONS.values():  # one --help group per section
        assert groups[section.TITLE] == {f.name for f in dataclasses.fields(section)}
    assert groups[MegatronLMFlags.TITLE] == ADAPTER_FLAGS


def test_the_command_line_is_read_once_into_frozen_settings():
    argv = ["--data-path", "d", "--train-iters", "100", "--lr-warmup-iters", "0", "--mask-prob", "0.15"]
    given = given_values(argv)
    assert given == {"data_path": ["d"], "train_iters": 100, "lr_warmup_iters": 0, "mask_prob": 0.15}
    settings = parse_settings(argv)
    assert (settings.training.min_lr, settings.training.lr_decay_iters, settings.precision.bf16) == (
        pytest.approx(6e-5), 90, False)
    assert settings.model.transformer_impl == "local"  # "auto" decided once, for this machine (no GPU)
    assert settings.data.mask_rate == 0.15  # Megatron-LM's alias, mapped onto the setting
    assert settings.explicit == {"data_path", "train_iters", "lr_warmup_iters", "mask_rate"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.training.lr = 1.0
    assert set(settings.as_dict()) == {f.name for f in declared_fields()}


@pytest.mark.parametrize("flags", [["--legacy-tokenizer"], ["--auto-detect-ckpt-format"], ["--bert-no-binary-head"],
                                   ["--untie-embeddings-and-output-weights"], ["--ckpt-fully-parallel-save"],
                                   ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope"],
                                   ["--use-checkpoint-opt-param-scheduler"], ["--dataloader-type", "single"],
                                   ["--short-seq-prob", "0"], ["--timing-log-level", "0"],
                                   ["--ckpt-format", "torch_dist"], ["--distributed-backend", "gloo"]])
def test_megatron_lm_flags_that_choose_nothing_are_accepted_and_are_no_settings(flags):
    argv = ["--data-path", "d", "--train-iters", "100", "--lr-warmup-iters", "0"]
    with_flags = parse_settings(argv + flags)
    assert with_flags == parse_settings(argv)
    assert not ADAPTER_FLAGS & set(with_flags.as_dict())


def test_a_settings_file_is_read_as_the_command_line_would_read_it(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("lr: 6e-4\nmin-lr: 1.0e-5\ndata_path: corpus\nmask_prob: 0.15\n")
    settings = parse_settings(["--config", str(config), "--lr", "1e-3", "--lr-warmup-iters", "0"])
    assert (settings.training.lr, settings.training.min_lr) == (1e-3, 1e-5)  # the command line wins over the file
    assert settings.data.data_path == ["corpus"] and settings.data.mask_rate == 0.15
    assert {"lr", "min_lr", "data_path", "mask_rate"} <= settings.explicit
    config.write_text("lr-decay-style: sqrt\n")
    with pytest.raises(ValueError, match="lr-decay-style: 'sqrt' is not one of"):
        parse_settings(["--config", str(config), "--mock-data"])


def test_the_library_builds_settings_without_a_command_line():
    settings = Settings()  # every declared default
    assert settings.training.lr == 6e-4 and settings.model.transformer_impl == "auto"
    assert isinstance(build_parser(), argparse.ArgumentParser)


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
    logging.getLogger("megatron_neobert.training.reporting.profiling").info("rank 1's profile",
                                                                           extra={"every_rank": True})
    logging.getLogger("some_library").info("not ours")
    printed = capsys.readouterr()
    assert printed.out == "ckpt was saved with --no-save-rng: RNG states not restored\nrank 1's profile\n"
    assert printed.err == "WARNING megatron_neobert.training.trainer_checkpoint: iteration folders are incomplete\n"



def test_every_data_setting_is_in_the_data_stream_or_said_not_to_change_the_sample_order():
    """A data setting added without a decision fails here: in DATA_STREAM_KEYS, a resumed run with another value reads
    the new data from its start; outside, it keeps the checkpoint's data position."""
    from megatron_neobert.training.config.settings import DataSettings
    from megatron_neobert.training.engine.trainer import DATA_STREAM_KEYS

    same_order = {"valid_data_path", "test_data_path",  # validation and test splits, not the training order
                  "vocab_file",  # named by tokenizer_model once resolved
                  "null_tokenizer_pad_id", "null_tokenizer_cls_id", "null_tokenizer_sep_id", "null_tokenizer_mask_id",
                  "data_cache_path", "data_loader", "num_workers",  # where and how the same samples are read
                  "mask_rate", "mask_scheme"}  # the masks, drawn afresh for the same documents
    data = {f.name for f in dataclasses.fields(DataSettings)}
    assert data == (set(DATA_STREAM_KEYS) - {"seed"}) | same_order
    assert "seed" in {f.name for f in dataclasses.fields(SECTIONS["training"])}  # the one key from another section
