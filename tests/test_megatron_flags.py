"""Megatron-LM's flags as its BERT users pass them: its example script run unchanged but for the preset, each
of its flags taken with its meaning or refused in one line, and the meanings that change a run."""

import math
import os
import re
import subprocess
import sys

import pytest
import torch

from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.megatron_core_compat import load_common_state
from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.training.config.arguments import parse_settings
from checkpoint_files import args_only_checkpoint
from pretrain_cases import run_train
from test_train_log import ITERATION, MEGATRON_FIELDS, VALIDATION

VOCAB = os.path.join(SAMPLE_TOKENIZER, "vocab.txt")


def bert_example_argv(prefix, root):
    """Megatron-LM's examples/bert/train_bert_340m_distributed.sh (core_v0.16.1), its sizes cut to a 2-rank
    CPU run (TP 8 x PP 16 -> TP 2), and nothing else changed but --model-preset."""
    model = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
             "--max-position-embeddings", "64", "--attention-backend", "auto"]
    training = ["--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "4", "--weight-decay", "1e-2",
                "--clip-grad", "1.0", "--fp16", "--lr", "0.0001", "--lr-decay-iters", "4", "--lr-decay-style",
                "linear", "--min-lr", "1.0e-5", "--weight-decay", "1e-2", "--lr-warmup-fraction", ".01",
                "--clip-grad", "1.0"]
    parallel = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"]
    data = ["--data-path", prefix, "--vocab-file", VOCAB, "--split", "949,50,1"]
    logging = ["--log-interval", "2", "--save-interval", "2", "--eval-interval", "2", "--save", str(root / "ckpt"),
               "--load", str(root / "ckpt"), "--eval-iters", "1", "--tensorboard-dir", str(root / "tb")]
    return model + training + parallel + data + logging + ["--model-preset", "neobert-tiny"]


def _torchrun(argv) -> list:
    """The trainer's stdout lines from torchrun on 2 ranks (the run must succeed)."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "megatron_neobert.pretrain", *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.splitlines()


@pytest.mark.integration
def test_megatron_lm_bert_example_runs_with_only_the_preset_added(data, tmp_path):
    lines = _torchrun(bert_example_argv(data[0], tmp_path))
    iterations = [line for line in lines if ITERATION.match(line)]
    assert [ITERATION.match(line).groups() for line in iterations] == [("2", "4"), ("4", "4")]
    for line in iterations:  # a Megatron-LM log parser finds every field it looks for
        skipped = int(re.search(r"number of skipped iterations: +(\d+) \|", line).group(1))
        for name in MEGATRON_FIELDS:
            found = re.search(rf" {name}: +[-+.\dE]+ \|", line)
            if name in ("num zeros", "params norm"):  # behind their flags
                assert not found, line
            elif name in ("lm loss", "grad norm"):  # as Megatron-LM: absent when fp16 overflow skipped every step
                assert bool(found) == (skipped < 2), line
            else:
                assert found, (name, line)
    assert len([line for line in lines if VALIDATION.match(line)]) == 2
    assert os.path.isfile(tmp_path / "ckpt" / "latest_checkpointed_iteration.txt")


@pytest.mark.integration
def test_megatron_lm_mock_data_block_trains_with_the_null_tokenizer(tmp_path):
    """The BERT example with Megatron-LM's mock-data block (its examples/llama script's: --mock-data --tokenizer-type
    NullTokenizer --vocab-size, and the --split its real-data block has too) in place of its data flags; in fp32,
    where the example's --fp16 skips each of these few steps for an overflow of its initial loss scale."""
    argv = bert_example_argv("unused", tmp_path)
    at = argv.index("--data-path")
    argv[at:at + 6] = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "8192",
                       "--split", "949,50,1"]
    argv.remove("--fp16")
    lines = _torchrun(argv)
    print("\n".join(lines))
    losses = [float(re.search(r" lm loss: ([-+.\dE]+) \|", line).group(1)) for line in lines if ITERATION.match(line)]
    assert losses == pytest.approx([math.log(8192)] * 2, abs=0.1)  # about uniform over the data's ids at first
    validation = [float(VALIDATION.match(line).group(2)) for line in lines if VALIDATION.match(line)]
    assert len(validation) == 2 and validation[1] < validation[0]
    assert "--split 949,50,1 does not apply to --mock-data: megatron-core splits mock data 1,1,1" in lines
    assert ("NullTokenizer: the data's ids 0 .. 8191 taken as they are; end of document 8192, [PAD] 8193, [CLS] 8194, "
            "[SEP] 8195, [MASK] 8196; vocabulary 8197") in lines
    assert any(line.startswith("layout: ") and line.endswith("vocab 8197 (padded 8448)") for line in lines)
    iterations = [ITERATION.match(line).groups() for line in lines if ITERATION.match(line)]
    assert iterations == [("2", "4"), ("4", "4")]


def _refusal(argv):
    with pytest.raises(ValueError) as err:
        parse_settings(argv)
    message = str(err.value)
    assert "\n" not in message
    return message


BASE = ["--mock-data", "--model-preset", "neobert-tiny", "--tokenizer-model", SAMPLE_TOKENIZER, "--train-iters", "10",
        "--lr-warmup-iters", "1"]


@pytest.mark.parametrize("flags, meaning", [
    (["--attention-backend", "auto"], ("attention_backend", "auto")),
    (["--attention-backend", "local"], ("transformer_impl", "local")),
    (["--skip-train"], ("skip_train", True)),
    (["--log-params-norm"], ("log_params_norm", True)),
    (["--log-num-zeros-in-grad"], ("log_num_zeros_in_grad", True)),
    (["--tensorboard-log-interval", "5"], ("tensorboard_log_interval", 5)),
    (["--log-timers-to-tensorboard"], ("log_timers_to_tensorboard", True)),
    (["--log-validation-ppl-to-tensorboard"], ("log_validation_ppl_to_tensorboard", True)),
    (["--log-memory-to-tensorboard"], ("log_memory_to_tensorboard", True)),
    (["--log-world-size-to-tensorboard"], ("log_world_size_to_tensorboard", True)),
    (["--no-log-loss-scale-to-tensorboard"], ("log_loss_scale_to_tensorboard", False)),
    (["--mask-prob", "0.15"], ("mask_rate", 0.15)),
    (["--hidden-dropout", "0.1"], ("hidden_dropout", 0.1)),
    (["--attention-dropout", "0.1"], ("attention_dropout", 0.1)),
    (["--init-method-std", "0.02"], ("init_method_std", 0.02)),
    (["--no-save-rng"], ("no_save_rng", True)),
    (["--lr-warmup-init", "1e-5"], ("lr_warmup_init", 1e-5)),
    (["--dist-ckpt-strictness", "log_all"], ("dist_ckpt_strictness", "log_all")),
    (["--async-save"], ("async_save", True)),
    (["--log-straggler"], ("log_straggler", True)),
    (["--straggler-minmax-count", "4"], ("straggler_minmax_count", 4)),
    (["--disable-straggler-on-startup"], ("disable_straggler_on_startup", True)),
])
def test_megatron_lm_flag_is_taken(flags, meaning):
    """The flags that set something (those that choose nothing here: tests/test_settings.py)."""
    assert parse_settings(BASE + flags).as_dict()[meaning[0]] == meaning[1]


@pytest.mark.parametrize("flags, message", [
    (["--dataloader-type", "cyclic"], "--dataloader-type cyclic: only single is implemented"),
    (["--position-embedding-type", "learned_absolute"],
     "--position-embedding-type learned_absolute: the neobert-tiny preset has position_embedding_type rope; "
     "--model-preset ablation-m0 has learned_absolute"),
    (["--normalization", "LayerNorm"], "--model-preset ablation-m0 has LayerNorm"),
    (["--timing-log-level", "1"], "--timing-log-level 1: Megatron-LM's per-phase timers are not implemented"),
    (["--short-seq-prob", "0.1"], "--short-seq-prob 0.1: documents are packed whole"),
    (["--distributed-backend", "nccl"], "--distributed-backend nccl: this machine runs gloo"),
    (["--attention-backend", "flash"], "--attention-backend flash picks a Transformer Engine attention kernel"),
    (["--mask-prob", "0.15", "--mask-rate", "0.2"], "--mask-prob is Megatron-LM's name of --mask-rate"),
    (["--use-checkpoint-opt_param-scheduler", "--override-opt-param-scheduler"], "exclude each other"),
])
def test_megatron_lm_flag_is_refused_in_one_line(flags, message):
    assert message in _refusal(BASE + flags)


def test_swiglu_is_refused_for_a_gelu_preset():
    message = _refusal(["--mock-data", "--model-preset", "ablation-m0", "--swiglu"])
    assert message.startswith("--swiglu: the ablation-m0 preset has activation gelu; --model-preset neobert-250m")


def test_hidden_size_derives_the_mlp_width_and_the_vocabulary_is_the_tokenizers():
    from megatron_neobert.training.reporting.startup_report import startup_notes
    from megatron_neobert.training.engine.model_setup import run_model_shape

    settings = parse_settings(["--mock-data", "--model-preset", "neobert-tiny", "--hidden-size", "64",
                               "--vocab-file", VOCAB])
    assert settings.data.tokenizer_type == "BertWordPieceLowerCase"  # Megatron-LM's pretrain_bert.py default
    shape = run_model_shape(settings, tokenizer_vocab_size=5000)
    arch = shape.arch
    assert (arch.hidden_size, arch.ffn_hidden_size, arch.vocab_size) == (64, 176, 5000)
    overridden = startup_notes(settings, shape)[-2]  # the last: the precision's
    assert "ffn_hidden_size 344 -> 176 (derived from --hidden-size)" in overridden
    assert "vocab_size 8192 -> 5000 (the tokenizer's)" in overridden
    given = run_model_shape(parse_settings(BASE + ["--hidden-size", "64", "--ffn-hidden-size", "100",
                                                   "--vocab-size", "9000"]), 5000).arch
    assert (given.ffn_hidden_size, given.vocab_size) == (100, 9000)


def test_sequence_parallel_without_tensor_parallelism_is_said(tmp_path):
    from megatron_neobert.training.reporting.startup_report import startup_notes
    from megatron_neobert.training.engine.model_setup import run_model_shape

    settings = parse_settings(BASE + ["--sequence-parallel"])
    assert not settings.parallel.sequence_parallel
    assert "disabling sequence parallelism because tensor model parallelism is disabled" in startup_notes(
        settings, run_model_shape(settings))[-2]


def _model(argv):
    from megatron.core.utils import unwrap_model

    from megatron_neobert.training.engine.model_setup import run_model_shape, setup_model_and_optimizer

    settings = parse_settings(BASE + argv)
    _, chunks, _, _ = setup_model_and_optimizer(settings, run_model_shape(settings))
    return unwrap_model(chunks[0])


def test_dropout_and_init_std_reach_the_model(single_rank):
    """Megatron-LM's --hidden-dropout and --init-method-std change the model; the recipe has neither."""
    tokens = torch.randint(5, 8192, (2, 16))
    for dropout, differs in ((0.0, False), (0.3, True)):
        model = _model(["--hidden-dropout", str(dropout), "--seed", "3"]).train()
        first, second = model(tokens), model(tokens)
        assert (not torch.equal(first, second)) == differs
    recipe = _model(["--seed", "3"]).embedding.word_embeddings.weight.detach()
    normal = _model(["--init-method-std", "0.05", "--seed", "3"]).embedding.word_embeddings.weight.detach()
    assert recipe.abs().max() <= 0.02 and recipe.std() == pytest.approx(0.02 / 3**0.5, rel=0.05)  # uniform(-r, r)
    assert normal.std() == pytest.approx(0.05, rel=0.05) and normal.abs().max() > 0.15


def _short_run(prefix, cache, root, *extra):
    return ["--model-preset", "neobert-tiny", "--num-layers", "2", "--data-path", prefix, "--data-cache-path", cache,
            "--tokenizer-model", SAMPLE_TOKENIZER, "--seq-length", "64", "--micro-batch-size", "2",
            "--global-batch-size", "4", "--lr", "3e-3", "--lr-warmup-iters", "0", "--log-interval", "1",
            "--eval-interval", "2", "--eval-iters", "1", "--num-workers", "0", "--save", str(root), *extra]


@pytest.mark.integration
def test_pretrained_checkpoint_skip_train_and_no_save_rng(data, tmp_path):
    prefix, cache = data
    pre = tmp_path / "pre"
    first = run_on_ranks(run_train, 1, _short_run(prefix, cache, pre, "--train-iters", "2", "--no-save-rng"))[0]
    assert first["iteration"] == 2
    # --skip-train: one validation of the loaded weights, no step, nothing saved.
    skipped = run_on_ranks(run_train, 1, _short_run(prefix, cache, tmp_path / "skip", "--train-iters", "4",
                                                    "--load", str(pre), "--skip-train"))[0]
    assert (skipped["exit"], skipped["train"], len(skipped["eval"])) == ("skip-train", [], 1)
    assert skipped["iteration"] == 2
    with pytest.raises(RuntimeError, match="--skip-train runs one validation of --eval-iters batches, and there is "
                                           "none to run"):
        run_on_ranks(run_train, 1, _short_run(prefix, cache, tmp_path / "skip", "--train-iters", "4", "--load",
                                              str(pre), "--skip-train", "--eval-iters", "0"))
    # --pretrained-checkpoint: an empty --load starts from its weights at iteration 0, as --finetune; a folder
    # without a checkpoint is refused rather than trained from scratch.
    fine, empty = tmp_path / "fine", tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RuntimeError, match=rf"--pretrained-checkpoint {re.escape(str(empty))} holds no checkpoint"):
        run_on_ranks(run_train, 1, _short_run(prefix, cache, fine, "--train-iters", "2", "--load", str(fine),
                                              "--pretrained-checkpoint", str(empty)))
    tuned = run_on_ranks(run_train, 1, _short_run(prefix, cache, fine, "--train-iters", "2", "--load", str(fine),
                                                  "--pretrained-checkpoint", str(pre)))[0]
    scratch = run_on_ranks(run_train, 1, _short_run(prefix, cache, tmp_path / "scratch", "--train-iters", "2"))[0]
    assert [r["iteration"] for r in tuned["train"]] == [1, 2]
    # The same first batch (a fine-tune reads from the data's start): the scratch run's first loss is that of
    # the initial weights, as the pre-training's was; the pre-trained weights do better on it.
    assert scratch["train"][0]["loss"] == first["train"][0]["loss"]
    assert tuned["train"][0]["loss"] < scratch["train"][0]["loss"]


@pytest.mark.integration
def test_async_save_writes_the_checkpoints_a_synchronous_save_writes(data, tmp_path):
    """--async-save: the same weights, optimizer state and schedule in each folder, sealed with its checksums and
    named by the marker only once written; a resume from it goes on as from a synchronous one."""
    from megatron_neobert.checkpoint.integrity import MANIFEST
    from megatron_neobert.checkpoint.layout import iteration_dir, read_latest_iteration

    prefix, cache = data
    runs = {}
    for mode in ("sync", "async"):
        root = tmp_path / mode
        extra = ["--async-save"] if mode == "async" else []
        runs[mode] = run_on_ranks(run_train, 2, _short_run(prefix, cache, root, "--train-iters", "4",
                                                           "--save-interval", "2", "--use-distributed-optimizer",
                                                           "--keep-last-n-checkpoints", "1", *extra))[0]
        # Iteration 2 pruned once 4 was complete; the job's final goodput account beside the checkpoints.
        assert read_latest_iteration(str(root)) == 4 and sorted(os.listdir(root)) == [
            "goodput.json", "iter_0000004", "latest_checkpointed_iteration.txt"]
        assert os.path.isfile(os.path.join(iteration_dir(str(root), 4), MANIFEST))  # sealed; checked by the resume
    assert [r["loss"] for r in runs["sync"]["train"]] == [r["loss"] for r in runs["async"]["train"]]
    states = [load_common_state(iteration_dir(str(tmp_path / m), 4)) for m in ("sync", "async")]
    assert states[0]["opt_param_scheduler"] == states[1]["opt_param_scheduler"]
    resumed = {}
    for mode in ("sync", "async"):
        root = tmp_path / mode
        resumed[mode] = run_on_ranks(run_train, 2, _short_run(prefix, cache, root, "--train-iters", "6", "--load",
                                                              str(root), "--use-distributed-optimizer"))[0]
    assert [r["loss"] for r in resumed["sync"]["train"]] == [r["loss"] for r in resumed["async"]["train"]]
    assert [r["iteration"] for r in resumed["async"]["train"]] == [5, 6]


def test_pretrained_checkpoint_is_taken(tmp_path):
    pre = args_only_checkpoint(tmp_path / "pre")
    assert parse_settings(BASE + ["--pretrained-checkpoint", pre]).checkpoint.pretrained_checkpoint == pre


def test_a_pretrained_checkpoint_folder_without_a_checkpoint_is_refused_before_the_run(tmp_path):
    """Without a tokenizer flag the run takes the checkpoint's: the empty folder is found while parsing. (With one,
    the trainer refuses it: test_pretrained_checkpoint_skip_train_and_no_save_rng.)"""
    empty = tmp_path / "empty"
    empty.mkdir()
    i = BASE.index("--tokenizer-model")
    with pytest.raises(ValueError, match=rf"--pretrained-checkpoint {re.escape(str(empty))} holds no checkpoint "
                                         r"\(no latest_checkpointed_iteration.txt\)"):
        parse_settings(BASE[:i] + BASE[i + 2:] + ["--pretrained-checkpoint", str(empty)])


def test_use_checkpoint_args_does_not_claim_the_recipes_length(tmp_path):
    from megatron_neobert.training.config.resolve import recipe_defaults_applied

    ckpt = args_only_checkpoint(tmp_path / "ckpt", seq_length=128)
    settings = parse_settings(BASE + ["--load", ckpt, "--use-checkpoint-args"])
    applied = recipe_defaults_applied(settings)
    assert settings.data.seq_length == 128 and settings.from_checkpoint == {"seq_length"}
    assert applied and not any(item.startswith("--seq-length") for item in applied)
    assert any(item.startswith("--seq-length 1024") for item in recipe_defaults_applied(parse_settings(BASE)))


def test_use_checkpoint_args_values_reach_the_checks(tmp_path):
    """The checkpoint's args are read before the settings are checked, as Megatron-LM's load_args_from_checkpoint
    before validate_args: its length meets the FP8 token check, its architecture the architecture flags' check."""
    from megatron_neobert.model import get_arch

    fp8 = ["--fp8-format", "hybrid", "--bf16", "--micro-batch-size", "1"]
    on_hopper = dict(gpu_capability=(9, 0), te_available=True)
    ckpt = args_only_checkpoint(tmp_path / "ckpt", seq_length=100)
    parse_settings(BASE + ["--load", ckpt, *fp8], **on_hopper)  # without the flag, the command line's 1024
    with pytest.raises(ValueError, match=r"--fp8-format: tokens per micro-batch \(--micro-batch-size 1 x "
                                         r"--seq-length 100 = 100\) must be a multiple of 16"):
        parse_settings(BASE + ["--load", ckpt, "--use-checkpoint-args", *fp8], **on_hopper)
    m0 = args_only_checkpoint(tmp_path / "m0", arch=get_arch("ablation-m0"))
    parse_settings(BASE + ["--load", m0, "--position-embedding-type", "rope"])  # the preset's rope: agreed
    with pytest.raises(ValueError, match=r"--position-embedding-type rope: the checkpoint's model "
                                         r"\(--use-checkpoint-args\) has position_embedding_type learned_absolute"):
        parse_settings(BASE + ["--load", m0, "--use-checkpoint-args", "--position-embedding-type", "rope"])


def test_a_checkpoint_of_no_preset_shape_gives_the_run_its_shape(tmp_path):
    from megatron_neobert.model import NeoBERTArch
    from megatron_neobert.training.engine.model_setup import run_model_shape
    from megatron_neobert.checkpoint.state import read_common_state
    from megatron_neobert.checkpoint.layout import find_checkpoint

    arch = NeoBERTArch(2, 128, 4, 344, 8192, 512, norm_epsilon=1e-6)  # no preset's
    ckpt = args_only_checkpoint(tmp_path / "ckpt", arch=arch, hf_intermediate_size=512)
    common = read_common_state(find_checkpoint(ckpt))
    settings = parse_settings(BASE + ["--load", ckpt, "--use-checkpoint-args", "--seq-length", "128"])
    shape = run_model_shape(settings, 8192, common)
    assert (shape.arch, shape.preset, shape.changes, shape.hf_intermediate_size) == (arch, None, (), 512)
    wider = run_model_shape(parse_settings(BASE + ["--load", ckpt, "--use-checkpoint-args", "--hidden-size", "256"]),
                            8192, common)
    assert (wider.arch.hidden_size, wider.arch.ffn_hidden_size, wider.hf_intermediate_size) == (256, 688, None)
    assert "hidden_size 128 -> 256" in wider.changes
