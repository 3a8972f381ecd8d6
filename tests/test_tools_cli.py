"""Every tools/*.py: --help answers without importing megatron-core, torch or transformers (seconds each), shows a
help text and the default of every flag; flags are dashed and the underscore spellings of earlier versions still
parse; abbreviated flags are refused. Every command of megatron_neobert/cli/ is a console script of setup.py and a
tools/ script, and each console script's function answers --help."""

import ast
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_neobert.flags import ArgumentParser

REPO = Path(__file__).resolve().parents[1]
TOOLS = sorted(p.name for p in (REPO / "tools").glob("*.py"))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + sys.path))

# Runs each tool's --help in one fresh interpreter (the imports are shared, as on a user's machine) and reports,
# per tool, the heavy modules imported so far, the flags without help text and the help text itself.
PROBE = r"""
import json, runpy, sys
import megatron_neobert.flags as cli

seen = {}
original = cli.ArgumentParser.print_help
def print_help(self, file=None):
    seen["parser"] = self
    original(self, file)
cli.ArgumentParser.print_help = print_help

report = {}
for tool in sys.argv[1:]:
    seen.clear()
    sys.argv = [tool, "--help"]
    try:
        runpy.run_path(tool, run_name="__main__")
        code = "returned"
    except SystemExit as exit:
        code = exit.code
    parser = seen.get("parser")
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("megatron", "torch", "transformers"))
    report[tool] = dict(code=code, heavy=heavy[:5],
                        shared_parser=parser is not None,
                        no_help=[a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
                        if parser else None,
                        no_default=[a.option_strings[0] for a in parser._actions if a.option_strings
                                    and a.default not in (None, False, "==SUPPRESS==") and not a.required
                                    and "(default: " not in parser._get_formatter()._get_help_string(a)]
                        if parser else None,
                        help=parser.format_help() if parser else "")
print("REPORT" + json.dumps(report))
"""


@pytest.fixture(scope="module")
def help_report():
    out = subprocess.run([sys.executable, "-c", PROBE] + [f"tools/{t}" for t in TOOLS], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.split("REPORT", 1)[1])


@pytest.mark.parametrize("tool", TOOLS)
def test_help_without_heavy_imports_with_help_and_defaults(help_report, tool):
    r = help_report[f"tools/{tool}"]
    assert r["code"] == 0 and r["shared_parser"], r
    assert r["heavy"] == [], f"--help imported {r['heavy']}"
    assert r["no_help"] == [], f"flags without help text: {r['no_help']}"
    assert r["no_default"] == [], f"defaults not shown: {r['no_default']}"
    dashed_only = [w for w in r["help"].split() if w.startswith("--") and "_" in w.split("=")[0]]
    assert dashed_only == [], f"underscore flags shown: {dashed_only}"


def test_underscore_spellings_parse_and_stay_hidden():
    p = ArgumentParser(description="x")
    p.add_argument("--max-length", type=int, default=8, help="tokens")
    p.add_argument("--no-progress", action="store_true", help="quiet")
    p.add_argument("--text_field", default="text", help="an old-style flag keeps its own spelling")
    args = p.parse_args(["--max_length", "3", "--no_progress", "--text_field", "body"])
    assert (args.max_length, args.no_progress, args.text_field) == (3, True, "body")
    assert p.parse_args(["--max_length=5"]).max_length == 5
    assert p.parse_args(["--max-length", "--x_y"][:1] + ["6"]).max_length == 6
    assert "--max_length" not in p.format_help() and "(default: 8)" in p.format_help()
    assert "(default: False)" not in p.format_help()
    with pytest.raises(SystemExit):
        p.parse_args(["--unknown_flag", "1"])


def run_tool(tool, *args, timeout=120):
    return subprocess.run([sys.executable, f"tools/{tool}", *args], cwd=REPO, env=ENV, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


# Tools that read the trainer's flags answer a bad command line with the trainer's status, 1; the others with
# argparse's, 2. Either says it in one `error:` line.
TRAINER_FLAGS = {"build_data_cache.py"}


@pytest.mark.parametrize("tool", TOOLS)
def test_abbreviated_flags_are_refused(tool):
    # Were prefixes accepted, `--hel` would be --help: the help text and exit status 0.
    out = run_tool(tool, "--hel", timeout=60)
    assert out.returncode == (1 if tool in TRAINER_FLAGS else 2), (out.returncode, out.stderr[-2000:])
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith("error: "), out.stderr[-2000:]


def test_run_glue_refuses_a_prefix_of_tasks(tmp_path):
    # A prefix is an error, not the flag it begins: `--task` must not be read as `--tasks`.
    out = run_tool("run_glue.py", "--model", str(tmp_path / "m"), "--output-dir", str(tmp_path / "o"), "--task",
                   "SST-2", timeout=60)
    assert out.returncode == 2 and "unrecognized arguments: --task SST-2" in out.stderr, out.stderr[-2000:]


COMMANDS = sorted(p.stem for p in (REPO / "megatron_neobert" / "cli").glob("*.py")
                  if re.search(r"^def main\(", p.read_text(), re.M))
# Per command: the flags it requires, then a bad value (of an int flag, where the command has one).
BAD_VALUES = {
    "build_data_cache": ([], ["--seed", "x"]),
    "convert_checkpoint": (["--direction", "hf-to-mcore", "--load", "a", "--save", "b"],
                           ["--make-vocab-size-divisible-by", "x"]),
    "finetune_cde": (["--model", "m", "--output", "o", "--dataset", "d"], ["--batch-size", "x"]),
    "finetune_contrastive": (["--model", "m", "--output", "o", "--dataset", "d"], ["--max-negatives", "x"]),
    "goodput_model": ([], ["--seeds", "x"]),
    "make_length_subset": (["--input-prefix", "a", "--output-prefix", "b", "--min-tokens", "1"],
                           ["--min-tokens", "x"]),
    "merge_datasets": (["--input", "a", "--output-prefix", "b"], ["--output-prefix"]),  # no int flag: no value
    "preprocess_data": (["--input", "a", "--output-prefix", "b"], ["--workers", "x"]),
    "pseudo_perplexity": (["--model", "m", "--texts", "t", "--output", "o"], ["--batch-size", "x"]),
    "run_glue": (["--model", "m", "--output-dir", "o"], ["--epochs", "x"]),
    "run_mteb": (["--model", "m", "--output", "o"], ["--batch-size", "x"]),
    "stage2_plan": (["--stage1", "a", "--save", "b"], ["--iters", "x"]),
    "watch_run": (["--save", "s", "--suite", "y"], ["--interval", "x"]),  # no int flag: a float's
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", ["a mistyped flag", "a bad value"])
def test_a_bad_command_line_is_one_error_line(capsys, command, case):
    """Before: argparse's usage (up to 14 lines for neobert-run-glue), then `prog: error: ...`."""
    import importlib

    required, bad = BAD_VALUES[command]
    argv = required + {"a mistyped flag": ["--hepl"], "a bad value": bad}[case]
    try:
        status = importlib.import_module(f"megatron_neobert.cli.{command}").main(argv)
    except SystemExit as exit:
        status = exit.code
    err = capsys.readouterr().err
    assert status == (1 if f"{command}.py" in TRAINER_FLAGS else 2), (status, err)
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "usage:" not in err, err
    assert err.rstrip().endswith(" --help lists the flags"), err
    if case == "a mistyped flag":
        assert err.startswith("error: unrecognized arguments: --hepl (did you mean --help?); "), err


def test_the_bad_command_lines_cover_every_command():
    assert sorted(BAD_VALUES) == COMMANDS


@pytest.mark.integration
def test_data_tools_say_which_kernels_run_instead_of_megatron_cores_import_warnings(tmp_path):
    """megatron-core's import warns about each GPU extension it lacks (8 lines of "Transformer Engine and Apex are not
    installed" on a CPU) and logs its FSDP flavour: a tool that imports it says once which kernel paths run instead."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " + "the cat sat on the mat " * 40}) + "\n"
                              for i in range(8)))
    data = str(tmp_path / "d")
    preprocess = run_tool("preprocess_data.py", "--input", str(corpus), "--json-keys", "text", "--output-prefix", data,
                          "--tokenizer-model", str(REPO / "megatron_neobert" / "assets" / "tokenizer"),
                          "--workers", "1", "--no-progress")
    subset = run_tool("make_length_subset.py", "--input-prefix", data + "_text_document", "--min-tokens", "8",
                      "--output-prefix", str(tmp_path / "long"))
    for out in (preprocess, subset):
        assert out.returncode == 0, out.stderr[-2000:]
        assert "Warning" not in out.stderr and "Megatron-FSDP" not in out.stderr, out.stderr[-2000:]
        assert out.stderr.count("INFO kernels: device: ") == 1, out.stderr[-2000:]


def console_scripts() -> dict:
    """name -> (module, function) of setup.py's console scripts."""
    setup = next(node for node in ast.walk(ast.parse((REPO / "setup.py").read_text()))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup")
    entry_points = ast.literal_eval(next(k.value for k in setup.keywords if k.arg == "entry_points"))
    return {name: tuple(target.split(":")) for name, target in
            (line.split("=") for line in entry_points["console_scripts"])}


def test_each_command_is_a_console_script_and_a_tools_script():
    commands = sorted(p.stem for p in (REPO / "megatron_neobert" / "cli").glob("*.py") if p.stem != "__init__")
    scripts = console_scripts()
    assert {f"neobert-{c.replace('_', '-')}": f"megatron_neobert.cli.{c}" for c in commands} == {
        name: module for name, (module, _) in scripts.items() if module.startswith("megatron_neobert.cli.")}
    for command in commands:  # the same command from a checkout
        assert f"from megatron_neobert.cli.{command} import main" in (REPO / "tools" / f"{command}.py").read_text()


CONSOLE_PROBE = r"""
import importlib, json, sys

codes = {}
for name, module, function in json.loads(sys.argv[1]):
    sys.argv = [name, "--help"]
    try:
        getattr(importlib.import_module(module), function)()
        codes[name] = "returned"
    except SystemExit as exit:
        codes[name] = exit.code
print("CODES" + json.dumps(codes))
"""


def test_console_scripts_answer_help():
    scripts = [(name, module, function) for name, (module, function) in console_scripts().items()]
    out = subprocess.run([sys.executable, "-c", CONSOLE_PROBE, json.dumps(scripts)], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.split("CODES", 1)[1]) == {name: 0 for name, _, _ in scripts}


def test_flags_are_declared_only_through_flags_py():
    # Every command declares its flags as setting() fields; flags.add_flags is the one add_argument call.
    calls = {str(path.relative_to(REPO)): path.read_text().count(".add_argument(")
             for path in (REPO / "megatron_neobert").rglob("*.py")}
    assert {path: n for path, n in calls.items() if n} == {"megatron_neobert/flags.py": 1}


def test_usage_examples_keep_their_line_breaks(help_report):
    # A backslash ending a line of a non-raw docstring joins the next line, indentation and all, onto it.
    for tool, r in help_report.items():
        description = r["help"].split("\noptions:\n")[0].split("\n\n", 1)[1]
        joined = [line for line in description.splitlines() if re.search(r"\S {2,}[^\s#]", line)]
        assert joined == [], (tool, joined)


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"LOCAL_RANK": "1"}, {"RANK": "3", "LOCAL_RANK": "0"}])
def test_help_is_printed_by_the_first_rank_only(monkeypatch, capsys, env):
    from megatron_neobert.cli import merge_datasets

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit:
        merge_datasets.main(["--help"])
    assert exit.value.code == 0 and capsys.readouterr() == ("", "")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit) as exit:
        merge_datasets.main(["--help"])
    assert exit.value.code == 0 and "--shard-dir" in capsys.readouterr().out


def test_a_bad_command_line_is_said_by_the_first_rank_only(monkeypatch, capsys):
    from megatron_neobert.cli import merge_datasets

    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as exit:
        merge_datasets.main(["--hepl"])
    assert exit.value.code == 2 and capsys.readouterr() == ("", "")


LOGGING_PROBE = r"""
import logging
from megatron_neobert.cli import make_length_subset

assert make_length_subset.main(["--input-prefix", "missing", "--output-prefix", "out", "--min-tokens", "1"]) == 1
print(logging.getLogger().handlers, logging.getLevelName(logging.getLogger().level))
"""


def test_a_command_called_in_process_leaves_logging_as_it_found_it():
    """Before: its basicConfig left the root logger at INFO with a stderr handler, and the trainer's main its
    console and megatron_neobert at INFO: every later INFO line of the process went through (into a test's caplog)."""
    from megatron_neobert.cli import logging_kept

    out = subprocess.run([sys.executable, "-c", LOGGING_PROBE], cwd=REPO, env=ENV, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout == "[] WARNING\n", (out.stdout, out.stderr[-2000:])
    package = logging.getLogger("megatron_neobert")
    level, handlers = package.level, list(package.handlers)
    with logging_kept():  # as pretrain.main around configure_logging
        package.setLevel(logging.INFO)
        package.addHandler(logging.NullHandler())
    assert (package.level, package.handlers) == (level, handlers)
