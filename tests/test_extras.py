"""Each command whose optional dependencies are missing ends in one `error:` line naming the extra to install, not
a traceback; and the extras those lines name are setup.py's."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_neobert.extras import EXTRAS
from setup_py import setup_py

REPO = Path(__file__).resolve().parents[1]


def test_the_extras_are_setup_pys():
    declared = setup_py()["setup"]["extras_require"]
    assert {extra: sorted(declared[extra]) for extra in EXTRAS} == {e: sorted(d) for e, d in EXTRAS.items()}
    assert {name for names in EXTRAS.values() for name in names} <= set(declared["test"])  # CI runs them all


@pytest.mark.parametrize("module, reader", [("megatron_neobert.evaluation.pseudo_perplexity", "load_texts"),
                                            ("megatron_neobert.embeddings.data", "load_pair_dataset")])
def test_a_hub_dataset_without_datasets_names_the_eval_extra(module, reader, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    with pytest.raises(ValueError, match=r'hub dataset owner/name needs datasets, not installed: .*"\.\[eval\]"'):
        getattr(importlib.import_module(module), reader)("owner/name")


def the_commands(tmp_path: Path) -> dict:
    """{console script: argv}: each command as its docs run it, up to the first step that needs an extra."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a model folder to the checks that run before the extra's
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"query": "q", "positive": "p"}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    suite = tmp_path / "suite.yaml"
    suite.write_text("glue:\n  data_dir: glue\n  tasks: [SST-2]\n")
    out = str(tmp_path / "out")
    return {
        "neobert-run-glue": ["--model", str(model), "--output-dir", out, "--data-dir", "glue", "--tasks", "SST-2"],
        "neobert-run-mteb": ["--model", str(model), "--output", out, "--local-task", "tasks/NFCorpus"],
        "neobert-finetune-contrastive": ["--model", str(model), "--output", out, "--dataset", "owner/pairs"],
        "neobert-finetune-cde": ["--model", str(model), "--output", out, "--dataset", f"msmarco={pairs}"],
        "neobert-watch-run": ["--save", str(run), "--suite", str(suite)],
        "neobert-preprocess-data": ["--input", str(pairs), "--json-keys", "query", "--output-prefix", out,
                                    "--split-sentences"],
        "neobert-pretrain": ["--model-preset", "neobert-tiny", "--mock-data", "--wandb-project", "p",
                             "--wandb-exp-name", "e", "--save", out],
    }


# The console script in a process where every extra's modules fail to import, as after README's `pip install .`.
SCRIPT = """import importlib, sys
for module in {modules!r}:
    sys.modules[module] = None
sys.argv = [{command!r}, *{argv!r}]
module, function = {entry!r}.split(":")
sys.exit(getattr(importlib.import_module(module), function)())
"""


@pytest.mark.integration
def test_each_command_without_its_extra_names_the_install_in_one_line(tmp_path):
    entries = dict(line.replace(" ", "").split("=") for line in setup_py()["setup"]["entry_points"]["console_scripts"])
    modules = sorted({module for names in EXTRAS.values() for module in names.values()})
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    started = {command: subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(modules=modules, command=command, argv=argv, entry=entries[command])],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for command, argv in the_commands(tmp_path).items()}
    ends = {command: (process.wait(timeout=120), process.communicate()[1]) for command, process in started.items()}
    for command, (status, err) in ends.items():
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert status == 1 and len(errors) == 1 and "Traceback" not in err, f"{command}: {status}\n{err}"
        extra = "data" if command == "neobert-preprocess-data" else "wandb" if command == "neobert-pretrain" else "eval"
        assert f"not installed: install the package's {extra} extra (pip install \".[{extra}]\"" in errors[0], errors
