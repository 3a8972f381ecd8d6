"""Bad input ends the trainer and the tools with one `error:` line (on rank 0), a non-zero exit status and no
traceback, within seconds: the trainer checks flags and files before the process group exists, a checkpoint
before the model is built."""

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from hf_fixtures import make_neobert_folder
from megatron_neobert.kernels import transformer_engine_available
from megatron_neobert.pretrain import main
from pretrain_cases import tiny_argv


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
    # The datasets are checked before the tokenizer loads (a name may look for the Hub first).
    (["--data-path", "nowhere/corpus_content_document", "--tokenizer-model", "nowhere/tokenizer"],
     "dataset nowhere/corpus_content_document not found"),
    (["--lr-warmup-iters", "2000", "--train-iters", "3"],
     "--lr-warmup-iters 2000 must be below --lr-decay-iters 2 (90% of --train-iters 3, at least 1): for a short run "
     "pass --lr-warmup-iters 0"),
    (["--lr-decay-iters", "0"], "--lr-decay-iters 0 must be at least 1"),
    (["--vocab-size", "100"], "has 8,192 entries, more than the model's vocabulary of 100: raise --vocab-size"),
    pytest.param(["--fp8-format", "e4m3"], "--fp8-format e4m3 needs Transformer Engine, which does not import here",
                 marks=pytest.mark.skipif(transformer_engine_available(), reason="Transformer Engine imports here")),
    (["--ckpt-format", "torch"], "--ckpt-format torch: only torch_dist is written and read"),
    # Before megatron-core builds the model (its ValueError, a traceback): the run's shape against its TP size.
    (["--tensor-model-parallel-size", "8"], "--num-attention-heads 4 (model preset neobert-tiny) at "
     "--tensor-model-parallel-size 8: each rank computes whole heads, and 8 does not divide 4; use "
     "--tensor-model-parallel-size 1, 2 or 4"),
    (["--overlap-param-gather"], "--overlap-param-gather needs --use-distributed-optimizer"),
    (["--lr-warmup-fraction", "0.1"], "give --lr-warmup-fraction or --lr-warmup-iters, not both"),
])
def test_bad_flags_and_files_end_in_one_line(data, capsys, extra, message):
    assert message in fails_in_one_line(capsys, tiny_argv(*data, *extra))


def test_each_problem_of_the_parallel_split_is_its_own_error_line(data, capsys):
    """Before megatron-core builds the model (a traceback at its first problem), every problem of the split."""
    assert main(tiny_argv(*data, "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "3")) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert error_lines(err) == [
        "error: --num-attention-heads 4 (model preset neobert-tiny) at --tensor-model-parallel-size 8: each rank "
        "computes whole heads, and 8 does not divide 4; use --tensor-model-parallel-size 1, 2 or 4",
        "error: --num-layers 2 (model preset neobert-tiny) at --pipeline-model-parallel-size 3: each stage holds an "
        "equal share of the layers, and 3 does not divide 2; use --num-layers 3, or --pipeline-model-parallel-size 2"]


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
    assert ('--wandb-project needs wandb, not installed: install the package\'s wandb extra '
            '(pip install ".[wandb]"') in line


@pytest.fixture(scope="module")
def checkpoint(data, tmp_path_factory):
    """A checkpoint root of one step of the tiny model (2 x 64)."""
    root = str(tmp_path_factory.mktemp("one_step") / "ckpt")
    assert main(short_run(data, "--train-iters", "1", "--save", root)) == 0
    return root


def test_a_checkpoint_of_another_shape_is_named_before_the_model_is_built(data, checkpoint, capsys, tmp_path):
    root = checkpoint
    capsys.readouterr()
    save = tmp_path / "new" / "ckpt"  # made by the run's start, removed with its refusal
    line = fails_in_one_line(capsys, short_run(data, "--train-iters", "2", "--load", root, "--hidden-size", "128",
                                               "--num-layers", "3", "--save", str(save)))
    assert not (tmp_path / "new").exists()
    assert line == (f"error: checkpoint {root}/iter_0000001 holds a model of another shape (num_layers 2 there, 3 "
                    f"here; hidden_size 64 there, 128 here; this run: model preset neobert-tiny and its overrides): give "
                    f"the checkpoint's sizes, or --use-checkpoint-args to take them from it")


def refusals(tmp_path):
    """(extra flags, the error line's start) of the last inputs that ended in a traceback, and left an empty --save
    folder behind: each now refused before any rank starts work."""
    from hf_fixtures import make_tokenizer

    config = tmp_path / "run.yaml"
    config.write_text("train-iter: 2\n")
    return {
        "a negative learning rate": (["--lr", "-1"], "error: --lr -1.0 must be at least 0"),
        "a tokenizer smaller than the data's ids": (
            ["--tokenizer-model", str(make_tokenizer(tmp_path / "small_tokenizer"))],
            "error: dataset {prefix} was tokenized with HuggingFaceTokenizer"),
        "an unwritable --save": (["--save", "/sys/neobert/ckpt"],
                                 "error: --save /sys/neobert/ckpt: cannot write in /sys (Permission denied)"),
        "a --load that does not exist": (
            ["--load", str(tmp_path / "typo")],
            f"error: --load {tmp_path / 'typo'}: no checkpoint in {tmp_path / 'typo'} (the folder does not exist)"),
        "an unknown key in --config": (["--config", str(config)],
                                       f"error: {config}: unknown setting 'train-iter' (did you mean train-iters?)"),
    }


@pytest.mark.parametrize("case", ["a negative learning rate", "a tokenizer smaller than the data's ids",
                                  "an unwritable --save", "a --load that does not exist", "an unknown key in --config"])
def test_the_last_tracebacks_are_one_line_and_leave_nothing_on_disk(data, capsys, tmp_path, case):
    extra, expected = refusals(tmp_path)[case]
    save = tmp_path / "runs" / "ckpt"
    started = time.monotonic()
    line = fails_in_one_line(capsys, short_run(data, "--train-iters", "2", "--save", str(save), *extra))
    assert line.startswith(expected.format(prefix=data[0])), line
    assert not (tmp_path / "runs").exists()
    assert time.monotonic() - started < 30


def test_the_resume_idiom_starts_from_scratch_in_a_new_folder(data, capsys, tmp_path):
    """--save X --load X with no X yet: Megatron-LM's idiom for a run that resumes itself."""
    folder = str(tmp_path / "new")
    assert main(short_run(data, "--train-iters", "1", "--save", folder, "--load", folder)) == 0
    assert f"no checkpoint in {folder} (the folder does not exist): starting from scratch" in capsys.readouterr().out


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
    """Not a folder, not in the Hugging Face cache, no Hub: transformers would retry for about a minute. "At once":
    within 20 s of a start that fails at the same check for another reason (a missing dataset), so that a loaded
    machine's slow start counts in both."""
    env = dict(network, HF_HOME=str(tmp_path / "hf"))
    baseline, status, output = run_cli([sys.executable, "-m", "megatron_neobert.pretrain",
                                        *tiny_argv(str(tmp_path / "nowhere_content_document"), data[1])], env)
    assert status == 1 and "not found" in output, output
    argv = tiny_argv(*data, "--tokenizer-model", "my_tokenizer")
    seconds, status, output = run_cli([sys.executable, "-m", "megatron_neobert.pretrain", *argv], env)
    assert status == 1 and "Traceback" not in output, output
    assert len(error_lines(output)) == 1, output
    assert error_lines(output)[0].startswith(
        "error: cannot load Hugging Face tokenizer 'my_tokenizer' (offline runs need a local folder or a cached "
        f"name): no folder my_tokenizer in {os.getcwd()}, nor in the Hugging Face cache {tmp_path / 'hf'}/hub")
    assert seconds < baseline + 20, (seconds, baseline)


@pytest.mark.integration
@pytest.mark.parametrize("case", ["a mistyped flag", "before the process group", "after it"])
def test_only_rank_0_reports(data, checkpoint, tmp_path, case):
    """Two ranks meet the same fault; one line says it, and neither prints a traceback. A mistyped flag printed
    the usage once per rank before (253 lines, the `error:` at line 109). torchrun's own traceback for a rank's
    non-zero status stays (it raises ChildFailedError whatever the rank says), but its summary's root cause
    shows the rank's line in place of "To enable traceback see: ..."."""
    extra = {"a mistyped flag": ["--trian-iters", "2"],
             "before the process group": ["--data-path", str(tmp_path / "missing")],
             "after it": ["--load", checkpoint, "--hidden-size", "128"]}[case]
    status, output, ended_after_error = run_to_its_end_after_the_error(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "megatron_neobert.pretrain", *short_run(data, "--train-iters", "2", *extra)], {"OMP_NUM_THREADS": "1"})
    assert status != 0 and len(error_lines(output)) == 1, output
    assert "[rank" not in output and "usage:" not in output, output  # torchrun prefixes a rank's traceback
    root_cause = output[output.index("Root Cause"):]
    assert "exitcode  : 1 " in root_cause and f"traceback : {error_lines(output)[0]}" in root_cause, output
    if case == "a mistyped flag":
        assert error_lines(output)[0] == ("error: unrecognized arguments: --trian-iters 2 (did you mean "
                                          "--train-iters?); neobert-pretrain --help lists the flags")
    # The other rank is not left waiting for its peer (a collective's or the store's timeout, minutes): torchrun
    # ends the job as soon as the rank that said the line exits. Counted from the line, so that a loaded machine's
    # slow start of two ranks (45-75 s under CI's other tests) is not counted.
    print(f"{case}: torchrun ended {ended_after_error:.1f} s after the error line")
    assert ended_after_error < 20, (ended_after_error, output)


def run_to_its_end_after_the_error(command, env=None, timeout=180):
    """(exit status, stdout and stderr interleaved, seconds from the first `error:` line to the exit) of a command."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, **(env or {}))) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        lines, error_at = [], None
        try:
            for line in proc.stdout:
                if error_at is None and line.startswith("error:"):
                    error_at = time.monotonic()
                lines.append(line)
            status = proc.wait()
        finally:
            timer.cancel()
    assert error_at is not None, "".join(lines)
    return status, "".join(lines), time.monotonic() - error_at


def test_a_mistyped_flag_is_one_line_without_the_usage(data, capsys):
    """Before: argparse's usage (the trainer's fills a screen) and status 2."""
    assert fails_in_one_line(capsys, tiny_argv(*data, "--trian-iters", "5")) == (
        "error: unrecognized arguments: --trian-iters 5 (did you mean --train-iters?); neobert-pretrain --help lists "
        "the flags")
    assert fails_in_one_line(capsys, tiny_argv(*data, "--model-preset", "neobert-big")).startswith(
        "error: argument --model-preset: invalid choice: 'neobert-big' (choose from ")


@pytest.mark.parametrize("path, message", [
    ("{prefix}.bin", "--data-path {prefix}.bin: a dataset is named by its prefix, without .bin: --data-path {prefix}"),
    ("{prefix}.idx", "--data-path {prefix}.idx: a dataset is named by its prefix, without .idx: --data-path {prefix}"),
    ("{tmp}/corpus.idx", "--data-path {tmp}/corpus.idx: a dataset is named by its prefix, without .idx: --data-path "
                         "{tmp}/corpus (which names {tmp}/corpus.bin and {tmp}/corpus.idx; neither pair is there yet)"),
    ("{tmp}/corpus.parquet", "--data-path {tmp}/corpus.parquet is raw text: the trainer reads tokenized .bin / .idx "
                             "datasets; make one first with python tools/preprocess_data.py --input "
                             "{tmp}/corpus.parquet --output-prefix {tmp}/corpus --json-keys text --tokenizer-model "
                             "{tokenizer} (--json-keys: the field holding the text), then train with --data-path "
                             "{tmp}/corpus_text_document"),
    ("{tmp}/corpus.jsonl.gz", "--data-path {tmp}/corpus.jsonl.gz is raw text: the trainer reads tokenized .bin / .idx "
                              "datasets; make one first with python tools/preprocess_data.py --input "
                              "{tmp}/corpus.jsonl.gz --output-prefix {tmp}/corpus --json-keys text --tokenizer-model "
                              "{tokenizer} (--json-keys: the field holding the text), then train with --data-path "
                              "{tmp}/corpus_text_document"),
    ("{tmp}/random", "dataset {tmp}/random: {tmp}/random.idx is not a megatron-core index (bad header) (make it again "
                     "with python tools/preprocess_data.py)"),
])
def test_a_data_path_that_names_no_dataset_says_what_to_give(data, tmp_path, capsys, path, message):
    """Before: `--data-path X.bin` suggested `--output-prefix X.bin`, a Parquet file was a dataset "not found", and
    random bytes as an index failed in the dataset build with a traceback before the `error:` line."""
    from megatron_neobert.data.assets import SAMPLE_TOKENIZER

    (tmp_path / "random.idx").write_bytes(os.urandom(4096))
    (tmp_path / "random.bin").write_bytes(os.urandom(4096))
    names = dict(prefix=data[0], tmp=tmp_path, tokenizer=SAMPLE_TOKENIZER)
    argv = tiny_argv(*data)
    argv[argv.index("--data-path") + 1] = path.format(**names)
    assert fails_in_one_line(capsys, argv) == "error: " + message.format(**names)


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
def test_the_fine_tuning_tools_name_the_line_that_is_not_json(tool, hf_folder, tmp_path):
    main = importlib.import_module(f"tools.{tool}").main
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"query": "q", "positive": "p"}\n{"query": \n')
    assert tool_fails_in_one_line(main, ["--model", str(hf_folder), "--output", str(tmp_path / "out"), "--dataset",
                                         str(pairs)]) == f"error: {pairs}: line 2 is not valid JSON (Expecting value)"


# --------------------------------------------------------------------------------------------------
# A newcomer's first mistakes: one line, at once, and nothing written
# --------------------------------------------------------------------------------------------------


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tool(tool: str, *args, cwd=None):
    """(seconds, exit status, stdout + stderr) of tools/{tool}.py, as a user runs it."""
    return run_cli([sys.executable, os.path.join(REPO, "tools", f"{tool}.py"), *map(str, args)],
                   {"PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"})


def one_line_at_once(seconds, status, output, line):
    """Status 1, the one `error:` line expected, no traceback, in seconds (the imports, most of it)."""
    assert status == 1 and error_lines(output) == [line] and "Traceback" not in output, output[-3000:]
    assert seconds < 60, seconds


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    return make_neobert_folder(tmp_path_factory.mktemp("models") / "hf", num_hidden_layers=1)


def write_glue(root):
    """SST-2 with a short last row in train.tsv, RTE without its sentence2 column."""
    rows = [("the movie was good", 1), ("a bad film", 0)] * 8
    for split in ("train", "dev"):
        (root / "SST-2").mkdir(parents=True, exist_ok=True)
        (root / "RTE").mkdir(parents=True, exist_ok=True)
        short = "a short row\n" if split == "train" else ""
        (root / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows)
                                                     + short)
        (root / "RTE" / f"{split}.tsv").write_text("index\tsentence1\tlabel\n" + "".join(
            f"{i}\t{t}\tentailment\n" for i, (t, _) in enumerate(rows)))
    return root


@pytest.mark.integration
@pytest.mark.parametrize("case", ["a mistyped model folder", "a task file without a column", "a short row"])
def test_glue_checks_its_inputs_before_the_grid(case, hf_folder, tmp_path):
    """Before: the whole default grid (60 runs) failed run by run, each with a traceback, and left an output folder
    with an empty results.md. Now: one line before any run, and no output folder."""
    glue = write_glue(tmp_path / "glue")
    model = hf_folder.parent / "hff" if case == "a mistyped model folder" else hf_folder
    task = "RTE" if case == "a task file without a column" else "SST-2"
    run = run_tool("run_glue", "--model", model, "--tasks", task, "--data-dir", glue, "--output-dir",
                   tmp_path / "out", "--no-progress")
    line = {"a mistyped model folder": f"error: --model {model}: no such folder (did you mean {hf_folder}?)",
            "a task file without a column": f"error: RTE: {glue}/RTE/train.tsv lacks column(s) ['sentence2']; its "
                                            f"header is ['index', 'sentence1', 'label']",
            "a short row": f"error: SST-2: {glue}/SST-2/train.tsv line 18 has 1 column(s), expected at least 2"}[case]
    one_line_at_once(*run, line)
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
@pytest.mark.parametrize("case", ["missing", "a Hugging Face folder", "an empty folder"])
def test_the_watcher_refuses_a_folder_without_checkpoints(case, hf_folder, tmp_path):
    """Before: with --once it exited 0 printing nothing (without, it waited silently forever). Now: one line
    saying what it found, status 1, nothing written there."""
    suite = tmp_path / "suite.yaml"
    suite.write_text("pseudo_perplexity:\n  texts: texts.jsonl\n")
    root = {"missing": tmp_path / "no_run", "a Hugging Face folder": hf_folder,
            "an empty folder": tmp_path / "run"}[case]
    if case == "an empty folder":
        root.mkdir()
    before = sorted(os.listdir(root)) if root.exists() else None
    run = run_tool("watch_run", "--save", root, "--suite", suite, "--once")
    layout = "no latest_checkpointed_iteration.txt, no iter_NNNNNNN folder"
    line = {"missing": f"error: {root} does not exist: give the run's --save folder (the trainer makes it as it "
                       f"starts)",
            "a Hugging Face folder": f"error: {root} is a Hugging Face model folder (1_Pooling, config.json, "
                                     f"config_sentence_transformers.json, configuration_neobert.py, model.safetensors, "
                                     f"... ({len(before or [])} entries)), not a run's --save folder ({layout}): the "
                                     f"watcher exports each checkpoint itself; give the trainer's --save",
            "an empty folder": f"error: {root} holds no trainer checkpoint ({layout}; it holds: nothing): nothing to "
                               f"evaluate with --once"}[case]
    one_line_at_once(*run, line)
    assert (sorted(os.listdir(root)) if root.exists() else None) == before


@pytest.mark.parametrize("tool", ["finetune_contrastive", "finetune_cde"])
def test_the_fine_tuning_tools_check_the_model_folder_first(tool, hf_folder, tmp_path):
    """Before: a traceback ending in "FileNotFoundError: ... is not a folder" after the datasets were read."""
    main = importlib.import_module(f"tools.{tool}").main
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"query": "q", "positive": "p"}\n')
    mistyped = hf_folder.parent / "hff"
    assert tool_fails_in_one_line(main, ["--model", str(mistyped), "--output", str(tmp_path / "out"), "--dataset",
                                         str(pairs)]) == f"error: --model {mistyped}: no such folder (did you mean " \
                                                         f"{hf_folder}?)"
    assert not (tmp_path / "out").exists()


def test_a_model_source_is_a_model_folder_or_a_hub_name(hf_folder, tmp_path, monkeypatch):
    """The check every Hugging Face tool makes first: what is at the path, said the way that leads to the folder
    meant."""
    from megatron_neobert.model_source import check_model_source

    from huggingface_hub import constants

    monkeypatch.chdir(hf_folder.parent)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    check_model_source(hf_folder)
    check_model_source("hf")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    (tmp_path / "notes.txt").write_text("")
    for name, flag, message in [
        ("hff", "--model", "--model hff: no such folder (did you mean hf?)"),
        (str(hf_folder.parent / "hff"), "--model", f"--model {hf_folder.parent}/hff: no such folder (did you mean "
                                                   f"{hf_folder}?)"),
        (str(tmp_path / "ckpt"), "--load", f"--load {tmp_path}/ckpt: a trainer checkpoint, not a Hugging Face model "
                                           f"folder: export it first with neobert-convert-checkpoint --direction "
                                           f"mcore-to-hf --load {tmp_path}/ckpt --save HF_FOLDER"),
        (str(tmp_path), "--model", f"--model {tmp_path}: no config.json, so not a Hugging Face model folder (it "
                                   f"holds: ckpt, notes.txt)"),
        (str(tmp_path / "notes.txt"), "--model", f"--model {tmp_path}/notes.txt is a file, not a model folder"),
        ("chandar-lab/NeoBERT", "--model", f"--model chandar-lab/NeoBERT: no folder chandar-lab/NeoBERT in "
                                           f"{hf_folder.parent}, nor in the Hugging Face cache {tmp_path}/cache/hub, "
                                           f"and HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE forbid downloading it"),
    ]:
        with pytest.raises(ValueError) as err:
            check_model_source(name, flag)
        assert str(err.value) == message
    with pytest.raises(ValueError, match="^--model chandar-lab/NeoBERT: no such folder$"):
        check_model_source("chandar-lab/NeoBERT", hub=False)
