"""Bad input ends the trainer and the tools with one `error:` line (on rank 0), a non-zero exit status and no
traceback, within seconds: the trainer checks flags and files before the process group exists, a checkpoint
before the model is built."""

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from hf_fixtures import make_neobert_folder
from megatron_neobert.kernels import transformer_engine_available
from megatron_neobert.pretrain import main
from pretrain_cases import tiny_argv

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def short_run(data, *extra) -> list:
    """The tiny model for 1-2 steps: a schedule that fits them."""
    return tiny_argv(*data, "--lr-decay-iters", "20", *extra)


def error_lines(text: str) -> list:
    return [line for line in text.splitlines() if line.startswith("error:")]


def fails_in_one_line(capsys, argv) -> str:
    """The trainer's entry point in this process: status 1, one `error:` line and no traceback on stderr."""
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "Traceback" not in err, err
    return error_lines(err)[0]


@pytest.mark.parametrize("extra, message", [
    (["--data-path", "nowhere/corpus_content_document"],
     "dataset nowhere/corpus_content_document not found (no nowhere/corpus_content_document.bin / .idx): make it "
     "with python tools/preprocess_data.py --input CORPUS.parquet --output-prefix nowhere/corpus --json-keys content"),
    (["--lr-warmup-iters", "2000", "--train-iters", "3"],
     "--lr-warmup-iters 2000 must be below --lr-decay-iters 2 (90% of --train-iters 3, at least 1): for a short run "
     "pass --lr-warmup-iters 0"),
    (["--lr-decay-iters", "0"], "--lr-decay-iters 0 must be at least 1"),
    (["--vocab-size", "100"], "has 8,192 entries, more than the model's vocabulary of 100: raise --vocab-size"),
    pytest.param(["--fp8-format", "e4m3"], "--fp8-format e4m3 needs Transformer Engine, which does not import here",
                 marks=pytest.mark.skipif(transformer_engine_available(), reason="Transformer Engine imports here")),
    (["--ckpt-format", "torch"], "--ckpt-format torch: only torch_dist is written and read"),
    (["--overlap-param-gather"], "--overlap-param-gather needs --use-distributed-optimizer"),
    (["--lr-warmup-fraction", "0.1"], "give --lr-warmup-fraction or --lr-warmup-iters, not both"),
])
def test_bad_flags_and_files_end_in_one_line(data, capsys, extra, message):
    assert message in fails_in_one_line(capsys, tiny_argv(*data, *extra))


def test_the_recipe_warmup_in_a_short_run_names_the_flag_that_fixes_it(data, capsys):
    argv = tiny_argv(*data, "--train-iters", "3")
    warmup = argv.index("--lr-warmup-iters")
    del argv[warmup:warmup + 2]
    assert ("--lr-warmup-iters 2000 (the recipe's default) must be below --lr-decay-iters 2 (90% of --train-iters 3, "
            "at least 1): for a short run pass --lr-warmup-iters 0") in fails_in_one_line(capsys, argv)


def test_wandb_project_without_wandb(data, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    line = fails_in_one_line(capsys, tiny_argv(*data, "--wandb-project", "p", "--wandb-exp-name", "e", "--save", "x"))
    assert "--wandb-project needs the wandb package: pip install wandb" in line


@pytest.fixture(scope="module")
def checkpoint(data, tmp_path_factory):
    """A checkpoint root of one step of the tiny model (2 x 64)."""
    root = str(tmp_path_factory.mktemp("one_step") / "ckpt")
    assert main(short_run(data, "--train-iters", "1", "--save", root)) == 0
    return root


def test_a_checkpoint_of_another_shape_is_named_before_the_model_is_built(data, checkpoint, capsys):
    root = checkpoint
    capsys.readouterr()
    line = fails_in_one_line(capsys, short_run(data, "--train-iters", "2", "--load", root, "--hidden-size", "128",
                                               "--num-layers", "3"))
    assert line == (f"error: checkpoint {root}/iter_0000001 holds a model of another shape (num_layers 2 there, 3 "
                    f"here; hidden_size 64 there, 128 here; this run: --model-preset neobert-tiny and its overrides): give "
                    f"the checkpoint's sizes, or --use-checkpoint-args to take them from it")


def run_cli(command, env=None, timeout=120):
    """(seconds, exit status, stdout + stderr) of a command."""
    started = time.monotonic()
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    return time.monotonic() - started, out.returncode, out.stdout + out.stderr


NO_PROXY = {name: "" for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")}


@pytest.mark.integration
@pytest.mark.parametrize("network", [{"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "",
                                                                 "HF_ENDPOINT": "http://127.0.0.1:9", **NO_PROXY}],
                         ids=["offline", "hub-unreachable"])
def test_a_missing_tokenizer_fails_at_once(data, tmp_path, network):
    """Not a folder, not in the Hugging Face cache, no Hub: transformers would retry for about a minute."""
    argv = tiny_argv(*data, "--tokenizer-model", "my_tokenizer")
    seconds, status, output = run_cli([sys.executable, "-m", "megatron_neobert.pretrain", *argv],
                                      dict(network, HF_HOME=str(tmp_path / "hf")))
    assert status == 1 and "Traceback" not in output, output
    assert len(error_lines(output)) == 1, output
    assert error_lines(output)[0].startswith(
        "error: cannot load Hugging Face tokenizer 'my_tokenizer' (offline runs need a local folder or a cached "
        f"name): no folder my_tokenizer in {os.getcwd()}, nor in the Hugging Face cache {tmp_path / 'hf'}/hub")
    assert seconds < 30, seconds


@pytest.mark.integration
@pytest.mark.parametrize("case", ["before the process group", "after it"])
def test_only_rank_0_reports(data, checkpoint, tmp_path, case):
    """Two ranks meet the same fault; one line says it, and neither prints a traceback."""
    extra = (["--data-path", str(tmp_path / "missing")] if case == "before the process group"
             else ["--load", checkpoint, "--hidden-size", "128"])
    seconds, status, output = run_cli(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "megatron_neobert.pretrain", *short_run(data, "--train-iters", "2", *extra)], {"OMP_NUM_THREADS": "1"})
    assert status != 0 and len(error_lines(output)) == 1, output
    assert "[rank" not in output, output  # torchrun prefixes what a rank's traceback prints
    assert seconds < 60, seconds


# --------------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------------


def tool_fails_in_one_line(main, argv) -> str:
    """What a tool that ends in SystemExit prints (on stderr, status 1, as Python reports it)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    message = str(stop.value)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


@pytest.fixture(scope="module")
def big_config(tmp_path_factory):
    """An exported folder whose config.json says "hidden_size": "big"."""
    folder = make_neobert_folder(tmp_path_factory.mktemp("config") / "hf", num_hidden_layers=1)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, hidden_size="big")))
    return folder


def test_a_config_of_the_wrong_kind_is_named_by_every_hf_tool(big_config, tmp_path, capsys):
    from tools.convert_checkpoint import main as convert
    from tools.pseudo_perplexity import main as pseudo_perplexity
    from tools.run_glue import main as run_glue

    named = (f"{big_config}/config.json: Validation error for field 'hidden_size': TypeError: Field 'hidden_size' "
             f"expected int, got str (value: 'big')")
    assert convert(["--direction", "hf-to-mcore", "--load", str(big_config), "--save", str(tmp_path / "m")]) == 1
    assert error_lines(capsys.readouterr().err) == [f"error: {named}"]
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "a b c"}\n')
    assert tool_fails_in_one_line(pseudo_perplexity, ["--model", str(big_config), "--texts", str(texts),
                                                      "--output", str(tmp_path / "p")]) == f"error: {named}"
    for split in ("train", "dev"):
        (tmp_path / "glue" / "SST-2").mkdir(parents=True, exist_ok=True)
        (tmp_path / "glue" / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\ngood\t1\n")
    assert tool_fails_in_one_line(run_glue, ["--model", str(big_config), "--output-dir", str(tmp_path / "g"),
                                             "--data-dir", str(tmp_path / "glue"), "--tasks", "SST-2", "--devices", "cpu",
                                             "--no-progress"]).endswith(named)
    assert not (tmp_path / "m").exists() and not (tmp_path / "g" / "runs").exists()


def test_pseudo_perplexity_names_the_line_that_is_not_json(tmp_path):
    from tools.pseudo_perplexity import main

    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "a b c"}\n\nnot json\n')
    assert tool_fails_in_one_line(main, ["--model", "unused", "--texts", str(texts), "--output", str(tmp_path / "p")]) \
        == f"error: {texts}: line 3 is not valid JSON (Expecting value)"


def test_make_length_subset_creates_the_output_folder(data, tmp_path, capsys):
    from tools.make_length_subset import main

    output = tmp_path / "new" / "folder" / "long"
    assert main(["--input-prefix", data[0], "--output-prefix", str(output), "--min-tokens", "1024"]) == 0
    assert (output.parent / "long.bin").is_file() and (output.parent / "long.idx").is_file()


@pytest.mark.parametrize("tool", ["finetune_contrastive", "finetune_cde"])
def test_the_fine_tuning_tools_name_the_line_that_is_not_json(tool, tmp_path):
    main = importlib.import_module(f"tools.{tool}").main
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"query": "q", "positive": "p"}\n{"query": \n')
    assert tool_fails_in_one_line(main, ["--model", "unused", "--output", str(tmp_path / "out"), "--dataset",
                                         str(pairs)]) == f"error: {pairs}: line 2 is not valid JSON (Expecting value)"
