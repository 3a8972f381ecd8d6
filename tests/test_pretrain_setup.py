"""Trainer set-up without training: settings and YAML, the recipe's schedule, which checkpoint
folder a resume may load, throughput figures, the kernel report."""

import argparse
import dataclasses
import glob
import os
import types

import pytest

from megatron_neobert.model import get_arch
from megatron_neobert.training.engine.model_setup import build_scheduler, run_model_shape
from megatron_neobert.training.config.run_checks import check_vocabulary_rows
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.training.reporting.metrics import non_embedding_params, step_flops
from megatron_neobert.checkpoint.layout import (find_checkpoint, iteration_dir, prune_checkpoints,
                                                         write_latest_marker)

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, "examples")


def test_defaults_are_the_recipe():
    s = parse_settings(["--data-path", "d"])
    t = s.training
    assert (t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay, t.clip_grad) == (0.9, 0.95, 1e-8, 0.1, 1.0)
    assert (t.lr, t.min_lr, t.lr_warmup_iters, t.lr_decay_iters) == (6e-4, pytest.approx(6e-5), 2000, 900_000)
    assert (t.optimizer, t.lr_decay_style, s.data.mask_rate, s.data.mask_scheme) == ("adam", "cosine", 0.2, "mask")
    assert t.global_batch_size * s.data.seq_length == 2048 * 1024 and s.model.model_preset == "neobert-250m"


def test_yaml_config_and_flags_override_it(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lr: 1.0e-3\nseq-length: 128\npacked: false\ndata_path: from-yaml\n")
    s = parse_settings(["--config", str(cfg), "--seq-length", "256"])
    assert (s.training.lr, s.data.seq_length, s.data.packed, s.data.data_path, s.training.min_lr) == (
        1e-3, 256, False, ["from-yaml"], pytest.approx(1e-4))  # a list, as --data-path reads it
    cfg.write_text("learning-rate: 1.0\n")
    with pytest.raises(ValueError, match="unknown setting 'learning-rate'"):
        parse_settings(["--config", str(cfg), "--data-path", "d"])


def test_ablation_configs_parse():
    archs = {}
    for path in sorted(glob.glob(os.path.join(EXAMPLES, "ablations", "m*.yaml"))):
        s = parse_settings(["--config", path])
        archs[os.path.basename(path)] = (run_model_shape(s).arch, s)
    assert len(archs) == 10
    m0, m0_settings = archs["m0.yaml"]
    assert (m0.normalization, m0.activation, m0_settings.data.mask_scheme, m0_settings.data.mask_rate) == (
        "LayerNorm", "gelu", "80/10/10", 0.15)
    assert m0_settings.training.global_batch_size * m0_settings.data.seq_length == 131072
    assert m0_settings.training.optimizer == "adam-l2"
    assert archs["m3.yaml"][0].vocab_size == 32000
    assert archs["m5.yaml"][1].data.mask_scheme == "mask" and archs["m4.yaml"][1].training.optimizer == "adam"
    assert archs["m9.yaml"][0] == get_arch("neobert-250m")


def test_padded_vocabulary_is_the_checkpoints():
    argv = ["--data-path", "d", "--model-preset", "neobert-tiny", "--vocab-size", "8200"]
    settings = parse_settings(argv + ["--tensor-model-parallel-size", "2"])
    assert run_model_shape(settings).padded_vocab_size == 8448  # a multiple of 128 x TP 2
    arch = dict(dataclasses.asdict(get_arch("neobert-tiny")), vocab_size=8200)
    tp1_checkpoint = {"args": argparse.Namespace(padded_vocab_size=8320, arch=arch)}  # 8200 padded at TP 1
    shape = run_model_shape(settings, common=tp1_checkpoint)
    assert shape.padded_vocab_size == 8320
    check_vocabulary_rows(settings, shape, "ckpt")
    tp3 = parse_settings(argv + ["--tensor-model-parallel-size", "3"])
    with pytest.raises(ValueError, match="checkpoint ckpt has its vocabulary padded to 8320 rows, which "
                                         "--tensor-model-parallel-size 3 does not divide"):
        check_vocabulary_rows(tp3, run_model_shape(tp3, common=tp1_checkpoint), "ckpt")
    too_few = {"args": argparse.Namespace(padded_vocab_size=8192, arch=arch)}
    with pytest.raises(ValueError, match=r"8192 vocabulary rows, fewer than the model's vocabulary \(8200"):
        check_vocabulary_rows(settings, run_model_shape(settings, common=too_few), "ckpt")


@pytest.mark.parametrize("flags, message", [
    (["--profile-step-start", "12", "--profile-step-end", "12"], "--profile-step-start 12 and --profile-step-end 12"),
    (["--profile-step-end", "21"], "--profile-step-end 21 must satisfy 0 <= start < end <= --train-iters 20"),
    ([], None),
])
def test_profile_window_is_checked(flags, message, tmp_path):
    argv = ["--data-path", "d", "--train-iters", "20", "--lr-warmup-iters", "1", "--profile", *flags]
    if message:
        with pytest.raises(ValueError, match=message):
            parse_settings(argv + ["--save", str(tmp_path)])
    else:
        with pytest.raises(ValueError, match="--profile writes its trace to --tensorboard-dir, else to --save"):
            parse_settings(argv)
        assert parse_settings(argv + ["--save", str(tmp_path)]).profiling.profile_step_end == 12


def test_schedule_matches_the_recipe():
    training = parse_settings(["--data-path", "d"]).training
    opt = types.SimpleNamespace(param_groups=[{"params": []}])
    s = build_scheduler(training, opt)

    def lr_at(scheduler, iteration):  # the scheduler counts samples, as Megatron-LM's
        scheduler.num_steps = iteration * training.global_batch_size
        return scheduler.get_lr(scheduler.optimizer.param_groups[0])

    assert lr_at(s, 0) == 0.0
    assert lr_at(s, 1000) == pytest.approx(3e-4)
    assert lr_at(s, 2000) == pytest.approx(6e-4)
    assert lr_at(s, (2000 + 900_000) // 2) == pytest.approx(6e-5 + (6e-4 - 6e-5) / 2)  # cosine midpoint
    for step in (900_000, 950_000, 1_000_000, 1_050_000):  # 10% of the peak, then constant
        assert lr_at(s, step) == pytest.approx(6e-5)


@pytest.mark.parametrize("phase, first", [("resume", "set_up"), ("step", "set_up"), ("validate", "set_up"),
                                          ("save", "set_up"), ("finish", "resume")])
def test_a_trainer_phase_called_out_of_order_names_the_phase_to_run_first(phase, first):
    """Each phase reads what set_up or resume made: called before it, it says which, not an AttributeError."""
    from megatron_neobert.training.engine.trainer import Trainer

    settings = parse_settings(["--mock-data", "--train-iters", "10", "--lr-warmup-iters", "0"])
    trainer = Trainer(settings, tokenizer=None, data_files=None, forward_step=None, guards=None,
                      started=0.0, load_folder="", account=None)
    with pytest.raises(RuntimeError, match=f"^Trainer.{first} has not run: "):
        getattr(trainer, phase)()


def make_iteration(root, it, complete=True):
    path = iteration_dir(str(root), it)
    os.makedirs(path)
    if complete:
        open(os.path.join(path, "metadata.json"), "w").write("{}")
    return path


def test_cut_short_checkpoints_are_not_loaded(tmp_path):
    assert find_checkpoint(str(tmp_path / "none")) is None
    make_iteration(tmp_path, 10)  # a first save cut short before the marker: ignored
    assert find_checkpoint(str(tmp_path)) is None
    write_latest_marker(str(tmp_path), 10)
    make_iteration(tmp_path, 20, complete=False)  # a later save cut short: the marker still says 10
    assert find_checkpoint(str(tmp_path)) == iteration_dir(str(tmp_path), 10)
    write_latest_marker(str(tmp_path), 20)  # a marker naming an incomplete folder
    with pytest.raises(RuntimeError, match="incomplete"):
        find_checkpoint(str(tmp_path))
    write_latest_marker(str(tmp_path), 30)  # ... or a missing one
    with pytest.raises(RuntimeError, match="missing"):
        find_checkpoint(str(tmp_path))


def test_keep_last_n(tmp_path):
    for it in (10, 20, 30, 40):
        make_iteration(tmp_path, it)
    write_latest_marker(str(tmp_path), 30)  # 40: being written by a save in progress
    prune_checkpoints(str(tmp_path), 2)
    assert sorted(os.listdir(tmp_path)) == ["iter_0000020", "iter_0000030", "iter_0000040",
                                            "latest_checkpointed_iteration.txt"]


@pytest.mark.parametrize("preset", ["neobert-tiny", "ablation-m0"])
def test_non_embedding_parameters_are_the_models(single_rank, preset):
    from megatron_neobert.model import build_model, transformer_config

    arch = get_arch(preset, num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=48, vocab_size=128)
    model = build_model(arch, transformer_config(arch), transformer_impl="local")
    layers = sum(p.numel() for name, p in model.named_parameters() if name.startswith("decoder.layers."))
    assert non_embedding_params(arch) == layers


def test_step_flops_count_attention_per_document(single_rank):
    """step_flops of a packed micro-batch against the FLOPs PyTorch counts for the useful work of the
    actual model: forward and backward of each document alone, its head on its masked positions."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from megatron_neobert.model import build_model, transformer_config
    from megatron_neobert.training.reporting.metrics import attended_pairs

    arch = get_arch("neobert-tiny", num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=48,
                    vocab_size=128)
    model = build_model(arch, transformer_config(arch), transformer_impl="local")
    g = torch.Generator().manual_seed(0)
    lengths, pad_piece = [5, 9, 40], 10  # one 64-token sample: three documents, then padding
    docs = [torch.randint(5, 128, (n,), generator=g) for n in lengths]
    labels = [torch.where(torch.rand(n, generator=g) < 0.3, d, -100) for n, d in zip(lengths, docs)]
    counted = 0
    for doc, label in zip(docs, labels):
        # The math kernel is SDPA written as matmuls, which the counter sees (the fused ones it does not).
        with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
            loss, _ = model(doc[None], labels=label[None])
            loss.sum().backward()
        counted += counter.get_total_flops()

    tokens = torch.cat(docs + [torch.zeros(pad_piece, dtype=torch.long)])[None]
    batch = {"tokens": tokens, "cu_seqlens": torch.tensor([0, 5, 14, 54, 64], dtype=torch.int32)}
    predicted = int(sum((label != -100).sum() for label in labels))
    pairs = int(attended_pairs(batch, pad_id=0))
    formula = step_flops(arch, sum(lengths), predicted, pairs, vocab_size=128)
    # The counter leaves out the norms' elementwise work (0.6% here).
    assert formula == pytest.approx(counted, rel=0.01)
    # ... which is well below what counting attention over the whole sample would add.
    assert step_flops(arch, sum(lengths), predicted, sum(lengths) * 64, 128) > 1.1 * counted

    padded = {"attention_mask": torch.arange(64)[None] < torch.tensor([[5], [40]])}
    assert int(attended_pairs(padded, pad_id=0)) == pairs - 9 * 9


def test_kernel_report_names_the_fallbacks_on_cpu():
    import torch
    from megatron_neobert.model.kernel_report import kernel_report

    if torch.cuda.is_available():
        pytest.skip("CPU fallbacks only")

    from megatron.core import optimizer as mcore_optimizer

    report = kernel_report("auto", "torch")
    assert "PyTorch SDPA" in report["layers"] and report["device"].startswith("CPU")
    # The Adam megatron-core's optimizer uses here, named by the package it comes from.
    names = {"torch": "torch.optim.AdamW", "transformer_engine": "Transformer Engine FusedAdam",
             "apex": "apex FusedAdam"}
    assert report["optimizer"].startswith(names[mcore_optimizer.Adam.__module__.split(".")[0]])


@pytest.mark.integration
def test_the_kernels_line_names_dalis_version_without_importing_it_for_a_torch_loader():
    """DALI's import takes a second of each rank's start-up: a run with the torch DataLoader reads its version from
    its distribution, which says what the import would."""
    import subprocess
    import sys

    code = ("import sys; from megatron_neobert.model.kernel_report import kernel_report; "
            "said = dict(p.split('=') for p in kernel_report('auto', 'torch')['available'].split(', '))['dali']; "
            "imported = 'nvidia.dali' in sys.modules; from megatron_neobert.kernels import probe; "
            "print(said, imported, probe('dali') or 'no')")
    said, imported, version = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                             check=True).stdout.split()
    assert imported == "False" and said == version


@pytest.mark.parametrize("name, bf16, fp8", [
    ("NVIDIA H100 80GB HBM3", 989.0, 1979.0),  # SXM
    ("NVIDIA H100 PCIe", 756.0, 1513.0),
    ("NVIDIA H100 NVL", 835.5, 1670.5),
    ("NVIDIA H200", 989.0, 1979.0),
    ("NVIDIA H200 NVL", 835.5, 1670.5),
    ("NVIDIA A100-SXM4-80GB", 312.0, None),
    ("NVIDIA H100 SXM5 64GB", None, None),  # a name not in the table: no MFU, not the SXM 80GB's peak
    ("NVIDIA H800", None, None),
])
def test_mfu_peak_is_looked_up_by_the_exact_device_name(monkeypatch, name, bf16, fp8):
    import torch

    from megatron_neobert.training.reporting.metrics import peak_tflops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert (peak_tflops(fp8=False), peak_tflops(fp8=True)) == (bf16, fp8)


def test_an_unknown_gpu_is_logged_without_mfu(single_rank, monkeypatch, capsys):
    import torch

    from megatron_neobert.training.reporting.train_log import TrainingLog, configure_logging

    configure_logging()
    settings = parse_settings(["--mock-data"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H800")
    assert TrainingLog(settings, get_arch("neobert-tiny"), 128).peak is None
    assert capsys.readouterr().out == ("MFU not reported: no bf16 peak TFLOP/s known for 'NVIDIA H800' "
                                       "(training/reporting/metrics.py PEAK_TFLOPS)\n")


@pytest.mark.parametrize("iters, every", [(50_000, 2_500), (100, 5), (20, 1), (15, 15), (1, 1)])
def test_stage2_evaluates_and_saves_twenty_times_or_once_at_the_end(iters, every):
    """The paper's stage 2 (50k steps) every 2,500 steps; one after the quickstart (15 steps) only at its end,
    not at each step."""
    from megatron_neobert.training.config.stage2 import evaluation_interval

    assert evaluation_interval(iters) == every
