"""A Megatron-LM user's command line, flags, logs and checkpoint metadata, on CPU over gloo."""

import argparse
import glob
import math
import os

import pytest
import torch

from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.megatron_core_compat import load_common_state
from megatron_neobert.parallel.launch import run_on_ranks
from megatron_neobert.training.config.arguments import parse_settings
from pretrain_cases import run_train

VOCAB = os.path.join(SAMPLE_TOKENIZER, "vocab.txt")
SHAPE = ["--model-preset", "neobert-tiny", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--ffn-hidden-size", "128"]
ITERS = 4


def bert_example_argv(data, root, *extra):
    """Megatron-LM's examples/bert flags, with NeoBERT's preset (cut small) for --num-layers etc."""
    prefix, cache = data
    return [*SHAPE, "--seq-length", "64", "--max-position-embeddings", "64",
            "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", str(ITERS),
            "--weight-decay", "1e-2", "--clip-grad", "1.0", "--lr", "0.001", "--lr-decay-iters", "4",
            "--lr-decay-style", "linear", "--min-lr", "1.0e-5", "--lr-warmup-fraction", ".25",
            "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
            "--data-path", prefix, "--vocab-file", VOCAB, "--tokenizer-type", "BertWordPieceLowerCase",
            "--split", "949,50,1", "--log-interval", "2", "--save-interval", "2", "--eval-interval", "2",
            "--eval-iters", "1", "--save", str(root / "ckpt"), "--load", str(root / "ckpt"),
            "--tensorboard-dir", str(root / "tb"), "--log-throughput", "--log-timers-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--log-world-size-to-tensorboard", "--log-params-norm",
            "--log-num-zeros-in-grad", "--ckpt-format", "torch_dist",
            "--data-cache-path", cache, "--num-workers", "0", "--seed", "7", *extra]


@pytest.fixture(scope="module")
def bert_run(data, tmp_path_factory):
    """(root folder, history) of the Megatron-LM-style run on 2 ranks."""
    root = tmp_path_factory.mktemp("bert")
    history = run_on_ranks(run_train, 2, bert_example_argv(data, root))[0]
    return root, history


@pytest.mark.integration
def test_megatron_lm_bert_command_line_trains_saves_and_goes_on(bert_run, data):
    root, history = bert_run
    assert history["iteration"] == ITERS and len(history["eval"]) == 2
    losses = [r["loss"] for r in history["train"]]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert os.path.isfile(root / "ckpt" / "latest_checkpointed_iteration.txt")
    # Resumed with the shape taken from the checkpoint: the preset's own (4 x 128) would not load.
    argv = bert_example_argv(data, root, "--use-checkpoint-args")
    argv = argv[len(SHAPE):]
    argv[argv.index("--train-iters") + 1] = str(ITERS + 1)
    argv[argv.index("--lr-decay-iters") + 1] = str(ITERS + 1)
    argv[argv.index("--tensorboard-dir") + 1] = str(root / "tb-resumed")
    more = run_on_ranks(run_train, 1, argv + ["--model-preset", "neobert-tiny"])[0]
    assert more["iteration"] == ITERS + 1 and len(more["train"]) == 1


# The fields Megatron-LM's load_args_from_checkpoint (and load_checkpoint's sample counters) read
# from a checkpoint's args, at top level.
MEGATRON_LM_FIELDS = {
    "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "seq_length": 64, "num_attention_heads": 4,
    "num_query_groups": 4, "group_query_attention": False, "kv_channels": 16, "max_position_embeddings": 64,
    "position_embedding_type": "rope", "add_position_embedding": False, "use_rotary_position_embeddings": True,
    "rotary_base": 10000, "rotary_percent": 1.0, "rotary_interleaved": False, "add_bias_linear": False,
    "add_qkv_bias": False, "squared_relu": False, "swiglu": True, "untie_embeddings_and_output_weights": True,
    "apply_layernorm_1p": False, "normalization": "RMSNorm", "attention_dropout": 0.0, "hidden_dropout": 0.0,
    "num_experts": None, "tokenizer_type": "BertWordPieceLowerCase", "tokenizer_model": VOCAB,
    "padded_vocab_size": 8320,  # 8192 + Megatron-LM's [BOS] [EOS], padded to a multiple of 128 "ckpt_format": "torch_dist", "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": None,
    "num_layers_per_virtual_pipeline_stage": None, "expert_model_parallel_size": 1,
    "consumed_train_samples": ITERS * 8, "consumed_valid_samples": 2 * 8, "skipped_train_samples": 0,
    "make_vocab_size_divisible_by": 128, "vocab_file": VOCAB,
}


@pytest.mark.integration
def test_saved_args_read_with_megatron_lm_rules(bert_run):
    from megatron.core import dist_checkpointing

    from megatron_neobert.checkpoint.layout import iteration_dir

    root, _ = bert_run
    ckpt = iteration_dir(str(root / "ckpt"), ITERS)
    # torch.load(weights_only=True) inside megatron-core (which allows the args' Namespace), as Megatron-LM's tools
    # load it, from common.pt (0.16) or the .distcp files (0.19).
    common = load_common_state(ckpt)
    args = common["args"]
    assert isinstance(args, argparse.Namespace)
    assert common["checkpoint_version"] == 3.0 and common["iteration"] == ITERS
    assert dist_checkpointing.load_content_metadata(preloaded_state_dict=common)[
        "distrib_optim_sharding_type"] == "fully_reshardable"
    wrong = {k: (getattr(args, k, "<missing>"), v) for k, v in MEGATRON_LM_FIELDS.items()
             if getattr(args, k, "<missing>") != v}
    assert not wrong, wrong
    # The schedule counts samples and the FLOPs are kept, as Megatron-LM's tools read them.
    assert common["opt_param_scheduler"]["num_steps"] == ITERS * 8
    assert common["num_floating_point_operations_so_far"] > 0


@pytest.mark.integration
def test_tensorboard_has_megatron_lm_tags(bert_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, history = bert_run
    events = EventAccumulator(str(root / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    megatron = {"lm loss", "learning-rate", "grad-norm", "iteration-time", "throughput", "batch-size", "loss-scale",
                "world-size", "params-norm", "num-zeros", "lm loss validation", "lm loss validation ppl",
                "lm loss vs samples", "learning-rate vs samples", "lm loss validation vs samples",
                "lm loss validation ppl vs samples"}
    assert megatron <= tags, megatron - tags
    assert {"train/accuracy", "perf/tokens_per_s", "validation/accuracy"} <= tags
    assert {e.value for e in events.Scalars("loss-scale")} == {1.0}  # fp32: written as Megatron-LM does, 1.0
    assert {e.value for e in events.Scalars("world-size")} == {2.0}
    assert [e.value for e in events.Scalars("params-norm")] == pytest.approx(
        [r["params_norm"] for r in history["train"]], rel=1e-6)
    assert [e.value for e in events.Scalars("lm loss validation ppl")] == pytest.approx(
        [math.exp(r["loss"]) for r in history["eval"]], rel=1e-6)
    loss = events.Scalars("lm loss")
    assert [e.step for e in loss] == list(range(1, ITERS + 1))
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in history["train"]], rel=1e-6)
    assert [e.step for e in events.Scalars("lm loss vs samples")] == [8 * i for i in range(1, ITERS + 1)]
    assert [e.value for e in events.Scalars("lm loss validation")] == pytest.approx(
        [r["loss"] for r in history["eval"]], rel=1e-6)
    # Megatron-LM's "learning-rate" at an iteration is the lr after that step's scheduler update: the next step's.
    lrs = [e.value for e in events.Scalars("learning-rate")]
    assert lrs[:-1] == pytest.approx([r["lr"] for r in history["train"][1:]], rel=1e-6)
    assert lrs == pytest.approx([r["logged_lr"] for r in history["train"]], rel=1e-6)


def _mock_argv(*extra):
    return [*SHAPE, "--mock-data", "--tokenizer-model", SAMPLE_TOKENIZER, "--seq-length", "64",
            "--micro-batch-size", "4", "--global-batch-size", "8", "--lr", "3e-3", "--log-interval", "2",
            "--eval-interval", "1000", "--eval-iters", "1", "--num-workers", "0", *extra]


@pytest.mark.integration
def test_mock_data_trains_with_a_sample_based_schedule(tmp_path):
    from megatron_neobert.checkpoint.layout import iteration_dir

    history = run_on_ranks(run_train, 1, _mock_argv("--train-samples", "64", "--lr-warmup-samples", "16",
                                                    "--lr-decay-samples", "48", "--save", str(tmp_path),
                                                    "--no-save-optim"))[0]
    assert history["iteration"] == 64 // 8
    common = load_common_state(iteration_dir(str(tmp_path), 8))
    assert "optimizer" not in common  # --no-save-optim
    assert (common["args"].train_samples, common["args"].consumed_train_samples, common["args"].mock_data) == (
        64, 64, True)
    # Uniform tokens: the loss starts at log(non-special ids); every step is taken.
    assert history["train"][0]["loss"] == pytest.approx(math.log(8192 - 5), abs=0.1)
    assert not any(r["skipped"] for r in history["train"])
    assert all(math.isfinite(r["loss"]) and 0 < r["grad_norm"] < 10 for r in history["train"])
    # The lrs the steps used: those of the same schedule counted in iterations.
    lrs = [r["lr"] for r in history["train"]]
    assert lrs == pytest.approx(_lrs(_mock_argv("--train-iters", "8", "--lr-warmup-iters", "2",
                                                "--lr-decay-iters", "6"), 8), abs=1e-12)


def test_mock_documents_are_deterministic():
    from megatron_neobert.data.datasets.mlm_dataset import MockDocuments
    from megatron_neobert.data.tokenizer import build_tokenizer

    tokenizer = build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER)
    a, b = MockDocuments(tokenizer, 64), MockDocuments(tokenizer, 64)
    for i in (0, 7, 99_999):
        assert (a.get(i) == b.get(i)).all() and len(a.get(i)) == a.sequence_lengths[i]
        assert not set(a.get(i).tolist()) & tokenizer.special_ids
    long_doc = int((a.sequence_lengths >= 8).argmax())
    assert (a.get(long_doc, 3, 4) == a.get(long_doc)[3:7]).all()


@pytest.mark.parametrize("kind", ["BertWordPieceLowerCase", "BertWordPieceCase"])
def test_wordpiece_from_vocab_file_matches_the_tokenizer_it_came_from(kind):
    from megatron_neobert.data.tokenizer import build_tokenizer

    hf = build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER)  # lower-cases, from the same vocab.txt
    wordpiece = build_tokenizer(kind, VOCAB)
    text = "Megatron-LM users pass --vocab-file: WordPiece splits unaffable words."
    # Megatron-LM's [BOS] [EOS] after the file's 8192 entries.
    assert (wordpiece.base_vocab_size, wordpiece.vocab_size, hf.vocab_size) == (8192, 8194, 8192)
    assert (wordpiece.pad_id, wordpiece.cls_id, wordpiece.sep_id, wordpiece.mask_id) == (
        hf.pad_id, hf.cls_id, hf.sep_id, hf.mask_id)
    same = wordpiece.tokenize(text) == hf.tokenize(text)
    assert same == (kind == "BertWordPieceLowerCase")


def _lrs(argv, steps):
    """The learning rate of each of the first `steps` iterations of the run's scheduler."""
    from megatron_neobert.training.engine.model_setup import build_scheduler

    training = parse_settings(argv).training
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = build_scheduler(training, optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        scheduler.step(increment=training.global_batch_size)
    return lrs


def test_sample_based_schedule_equals_the_iteration_based_one():
    base = ["--data-path", "x", "--global-batch-size", "16", "--lr-decay-style", "cosine"]
    samples = parse_settings(base + ["--train-samples", "1600", "--lr-decay-samples", "1280", "--lr-warmup-samples", "160"])
    assert samples.training.train_iters == 100
    iters = base + ["--train-iters", "100", "--lr-decay-iters", "80", "--lr-warmup-iters", "10"]
    by_samples = _lrs(base + ["--train-samples", "1600", "--lr-decay-samples", "1280", "--lr-warmup-samples", "160"], 100)
    assert by_samples == pytest.approx(_lrs(iters, 100), abs=1e-15)
    assert max(by_samples) == pytest.approx(6e-4) and by_samples[0] == 0.0


def test_warmup_fraction_is_a_fraction_of_the_decay():
    base = ["--data-path", "x", "--train-iters", "50", "--lr-decay-iters", "40"]
    assert _lrs(base + ["--lr-warmup-fraction", "0.25"], 50) == pytest.approx(
        _lrs(base + ["--lr-warmup-iters", "10"], 50), abs=1e-15)
    with pytest.raises(ValueError, match="--lr-warmup-fraction or --lr-warmup-iters"):
        parse_settings(base + ["--lr-warmup-fraction", "0.25", "--lr-warmup-iters", "10"])


@pytest.mark.parametrize("flag", ["--exit-signal-hand", "--tensorboard", "--lr-warmup", "--no-load-opt"])
def test_abbreviations_are_refused(flag):
    with pytest.raises(ValueError, match=f"^unrecognized arguments: {flag} 1 \\(did you mean --"):
        parse_settings(["--data-path", "x", flag, "1"])


@pytest.mark.parametrize("argv, message", [
    (["--ckpt-format", "torch"], "only torch_dist"),
    (["--train-samples", "100", "--train-iters", "5"], "not both"),
    (["--tokenizer-type", "BertWordPieceCase"], "needs --vocab-file"),
    (["--tokenizer-type", "BertWordPieceCase", "--vocab-file", "nowhere.txt"], "nowhere.txt"),
    (["--vocab-file", VOCAB, "--tokenizer-type", "HuggingFaceTokenizer"], "--vocab-file is read by"),
    (["--mock-data"], "--mock-data reads no files"),
    (["--train-data-path", "a", "--valid-data-path", "b"], "exclude each other"),
    (["--recompute-activations", "--recompute-granularity", "full"], "selective"),
    (["--wandb-project", "p", "--save", "s"], "--wandb-exp-name"),
    (["--use-checkpoint-args"], "give --load"),
    (["--fp16", "--bf16"], "exclude each other"),
])
def test_bad_megatron_lm_flags_are_refused_before_anything_is_built(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_settings(["--data-path", "x", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--train-data-path", "a", "--split", "98,1,1"], "--split divides --data-path"),
    (["--valid-data-path", "a"], "need --train-data-path"),
])
def test_data_sources_are_refused_when_mixed(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_settings(argv)


def test_split_with_mock_data_is_accepted_and_said_not_to_apply():
    """Megatron-LM's scripts pass --split with --mock-data (one block for mock and real data); megatron-core splits
    mock data 1,1,1 whatever it says, and the start-up notes say so."""
    from megatron_neobert.data.tokenizer import build_tokenizer
    from megatron_neobert.data.datasets.trainer_datasets import build_trainer_datasets
    from megatron_neobert.training.reporting.startup_report import startup_notes
    from megatron_neobert.training.engine.model_setup import run_model_shape

    given, plain = (parse_settings(_mock_argv("--train-iters", "10", "--lr-warmup-iters", "1", *split))
                    for split in (["--split", "949,50,1"], []))
    notes = startup_notes(given, run_model_shape(given))
    assert "--split 949,50,1 does not apply to --mock-data: megatron-core splits mock data 1,1,1" in notes
    assert not any("--split" in note for note in startup_notes(plain, run_model_shape(plain)))
    tokenizer = build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER)
    datasets = [build_trainer_datasets(settings, tokenizer) for settings in (given, plain)]
    for split in range(2):  # train, valid: the same documents with and without --split
        assert (datasets[0][split].config.split_matrix, len(datasets[0][split])) == (
            datasets[1][split].config.split_matrix, len(datasets[1][split]))
        assert (datasets[0][split][3]["tokens"] == datasets[1][split][3]["tokens"]).all()
    assert datasets[0][0].config.split_matrix == [(0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1.0)]


def test_recipe_defaults_are_reported_and_preset_overrides_are_named():
    from megatron_neobert.training.reporting.startup_report import startup_notes
    from megatron_neobert.training.engine.model_setup import run_model_shape

    settings = parse_settings(["--data-path", "x", "--adam-beta2", "0.999", "--recompute-activations", *SHAPE])
    assert settings.model.recompute_granularity == "selective"
    notes = startup_notes(settings, run_model_shape(settings))
    assert notes[0].startswith("NeoBERT where Megatron-LM's BERT differs: no binary (next-sentence) head")
    assert "--weight-decay 0.1 (Megatron-LM's default: 0.01)" in notes[1]
    assert "--lr-decay-style cosine" in notes[1] and "--adam-beta2" not in notes[1]
    assert "--hidden-dropout 0.0 (Megatron-LM's default: 0.1)" in notes[1]
    assert notes[2] == ("learning rate: linear warmup from 0 to 0.0006 until iteration 2000, then cosine decay to "
                        "6e-05 by iteration 900000, then 6e-05")
    assert "neobert-tiny overridden" in notes[3] and "num_layers 4 -> 2" in notes[3]
    assert "hidden_size 128 -> 64" in notes[3]
    plain = parse_settings(["--data-path", "x", "--model-preset", "neobert-tiny"])
    assert len(startup_notes(plain, run_model_shape(plain))) == 4  # with the schedule's and the precision's
    from megatron_neobert.training.config.arguments import build_parser

    help_text = " ".join(build_parser().format_help().split())
    assert "recipe default 0.95; Megatron-LM's: 0.999" in help_text
    assert "recipe default 10% of --lr; Megatron-LM's: 0.0" in help_text


def _step_with(optimizer_name, argv_extra=()):
    """(weights before, gradients, weights after, param groups) of one optimizer step of the trainer's
    optimizer; the groups as (weight decay, lr, parameter names)."""
    from megatron_neobert.training.engine.data_setup import build_data
    from megatron.core.utils import unwrap_model

    from megatron_neobert.training.engine.model_setup import run_model_shape, setup_model_and_optimizer
    from megatron_neobert.training.engine.forward_step import run_micro_batches

    settings = parse_settings(_mock_argv("--optimizer", optimizer_name, "--weight-decay", "0.5", "--lr", "0.01",
                                         "--lr-warmup-iters", "0", "--train-iters", "10", "--clip-grad", "0",
                                         "--adam-beta2", "0.999", *argv_extra))
    _, chunks, optimizer, _ = setup_model_and_optimizer(settings, run_model_shape(settings))
    _, batches, _ = build_data(settings, 0, 0)
    model = unwrap_model(chunks[0])
    names = {p: n for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    run_micro_batches(chunks, [next(batches) for _ in range(2)], forward_only=False)
    grads = {n: p.main_grad.detach().clone() for n, p in model.named_parameters()}
    groups = [(g["weight_decay"], g["lr"], [names[p] for p in g["params"]]) for g in optimizer.param_groups]
    assert optimizer.step()[0]
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    return before, grads, after, groups


def _reference_step(torch_optimizer, before, grads, groups):
    params = {n: torch.nn.Parameter(w.clone()) for n, w in before.items()}
    for n, p in params.items():
        p.grad = grads[n].clone()
    opt = torch_optimizer([{"params": [params[n] for n in names], "weight_decay": wd, "lr": lr}
                           for wd, lr, names in groups], betas=(0.9, 0.999), eps=1e-8)
    opt.step()
    return {n: p.detach() for n, p in params.items()}


def test_bf16_on_a_cpu_computes_in_bf16_and_the_start_up_says_so(single_rank):
    """--bf16 without a GPU is not ignored (before, the start-up said nothing either way): megatron-core's
    Float16Module holds bf16 weights and the layers compute in bf16 on the CPU; the optimizer steps fp32 copies."""
    from megatron.core.utils import unwrap_model

    from megatron_neobert.training.engine.data_setup import build_data
    from megatron_neobert.training.reporting.startup_report import startup_notes
    from megatron_neobert.training.engine.model_setup import run_model_shape, setup_model_and_optimizer
    from megatron_neobert.training.engine.forward_step import run_micro_batches

    settings = parse_settings(_mock_argv("--bf16", "--lr-warmup-iters", "0", "--train-iters", "10"))
    shape = run_model_shape(settings)
    assert startup_notes(settings, shape)[-1] == (
        "precision: bf16 weights and activations (linear layers, attention and norms compute in bf16, on the CPU as "
        "on a GPU); fp32 main weights, gradient reduction and optimizer state (--bf16)")
    plain = parse_settings(_mock_argv())
    assert startup_notes(plain, shape)[-1] == ("precision: fp32 weights, activations, gradients and optimizer state "
                                              "(the default without a GPU; --bf16 runs bf16 here too)")
    _, chunks, optimizer, _ = setup_model_and_optimizer(settings, shape)
    layers = ("ColumnParallelLinear", "RowParallelLinear", "RMSNorm", "BidirectionalAttention")
    computed = set()
    for module in unwrap_model(chunks[0]).modules():
        if type(module).__name__ in layers:
            module.register_forward_hook(lambda m, _, out: computed.add(
                (type(m).__name__, (out[0] if isinstance(out, tuple) else out).dtype)))
    _, batches, _ = build_data(settings, 0, 0)
    run_micro_batches(chunks, [next(batches)], forward_only=False)
    assert computed == {(name, torch.bfloat16) for name in layers}
    assert {p.dtype for p in unwrap_model(chunks[0]).parameters()} == {torch.bfloat16}
    assert {p.dtype for group in optimizer.param_groups for p in group["params"]} == {torch.float32}


@pytest.mark.parametrize("name, same_as, not_as", [("adam", torch.optim.AdamW, torch.optim.Adam),
                                                    ("adam-l2", torch.optim.Adam, torch.optim.AdamW)])
def test_adam_is_decoupled_and_adam_l2_is_not(name, same_as, not_as, single_rank):
    before, grads, after, groups = _step_with(name)
    assert any(wd > 0 for wd, _, _ in groups)
    expected, other = (_reference_step(opt, before, grads, groups) for opt in (same_as, not_as))
    for n in after:
        torch.testing.assert_close(after[n], expected[n], rtol=1e-5, atol=1e-7)
    assert max((after[n] - other[n]).abs().max().item() for n in after) > 1e-4


@pytest.mark.integration
def test_wandb_offline_run_writes_its_files(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is optional (pip install wandb); its test needs it")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_on_ranks(run_train, 1, _mock_argv("--train-iters", "2", "--lr-warmup-iters", "1", "--lr-decay-iters", "2", "--wandb-project", "neobert",
                                          "--wandb-exp-name", "smoke", "--wandb-save-dir", str(tmp_path),
                                          "--log-timers-to-tensorboard"))
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(runs) == 1
    (records,) = glob.glob(os.path.join(runs[0], "run-*.wandb"))
    with open(records, "rb") as f:
        logged = f.read()
    for tag in (b"lm loss", b"learning-rate", b"grad-norm", b"iteration-time", b"smoke"):
        assert tag in logged, tag  # the run's name and Megatron-LM's tags, in the records wandb sync uploads


@pytest.mark.integration
def test_fp16_scales_the_loss_and_skips_overflows_without_stopping(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # The gradients of the summed loss overflow fp16 at a scale of 8192 here, not at 1024.
    history = run_on_ranks(run_train, 1, _mock_argv(
        "--fp16", "--initial-loss-scale", "8192", "--max-skipped-iters", "1", "--train-iters", "6",
        "--lr-warmup-iters", "1", "--lr-decay-iters", "5", "--tensorboard-dir", str(tmp_path)))[0]
    records = history["train"]
    scales = [r["loss_scale"] for r in records]
    skipped = [r["skipped"] for r in records]
    assert history["iteration"] == 6 and skipped[:2] == [True, True] and not any(skipped[-2:])
    assert scales[0] == 8192 and scales[-1] < 8192 and scales == sorted(scales, reverse=True)
    assert all(math.isfinite(r["grad_norm"]) for r in records if not r["skipped"])
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [e.value for e in events.Scalars("loss-scale")] == scales


def test_per_split_data_paths_give_each_split_its_own_data(data, single_rank):
    from megatron_neobert.training.engine.data_setup import build_data

    prefix, cache = data
    settings = parse_settings(["--train-data-path", prefix, "--valid-data-path", prefix, "--tokenizer-model",
                               SAMPLE_TOKENIZER, "--data-cache-path", cache, "--seq-length", "64",
                               "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "10",
                               "--lr-warmup-iters", "1", "--eval-interval", "5", "--eval-iters", "1",
                               "--num-workers", "0"])
    _, train, valid = build_data(settings, 0, 0)
    first_train, first_valid = next(train), next(valid)
    assert first_train["tokens"].shape == first_valid["tokens"].shape == (2, 64)
    assert (first_train["labels"] != -100).any() and (first_valid["labels"] != -100).any()
