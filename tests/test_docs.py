"""The examples of docs/glue.md, docs/embeddings.md and docs/mteb.md run as written: their Python blocks, then
their command lines (each `neobert-NAME ...` runs the main of megatron_neobert/cli/NAME.py, as its console script
does, with the same arguments), with a tiny exported model as $MODEL, in a fresh folder."""

import importlib
import re
import shlex
from pathlib import Path

import pytest

from embed_fixtures import make_model_folder

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)
# What each example must leave behind.
OUTPUTS = {
    "glue.md": ["glue/SST-2/train.tsv", "glue_runs/results.md", "glue_runs/preset.json"],
    "embeddings.md": ["pairs.jsonl", "embed/model.safetensors", "cde/cde_config.json",
                      "cde/context_projection.safetensors"],
    "mteb.md": ["tasks/NFCorpus/qrels.tsv", "mteb_local/summary.md"],
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_folder(tmp_path_factory.mktemp("docs") / "neobert")


def commands(script: str):
    """The command lines of a bash block: continuation lines joined, one command per line."""
    for line in script.replace("\\\n", " ").splitlines():
        if line.strip():
            words = shlex.split(line)
            assert words[0].startswith("neobert-"), line
            yield words[0].removeprefix("neobert-").replace("-", "_"), words[1:]


@pytest.mark.parametrize("doc", sorted(OUTPUTS))
def test_doc_example_runs(doc, model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = BLOCK.findall((DOCS / doc).read_text())
    assert {kind for kind, _ in blocks} == {"python", "bash"}
    for kind, body in blocks:
        if kind == "python":
            exec(compile(body, f"{doc} example", "exec"), {"__name__": "__doc_example__"})
        else:
            for command, argv in commands(body.replace('"$MODEL"', str(model_dir))):
                importlib.import_module(f"megatron_neobert.cli.{command}").main(argv)
    missing = [p for p in OUTPUTS[doc] if not (tmp_path / p).exists()]
    assert not missing, missing
    printed = capsys.readouterr().out
    if doc == "glue.md":
        assert "32 the movie was good 1" in printed
    if doc == "mteb.md":
        summary = (tmp_path / "mteb_local" / "summary.md").read_text()
        assert "| NFCorpus | Retrieval |" in summary and "| MySTS | STS |" in summary
        assert summary.startswith(f"## MTEB results: {model_dir} @ "), summary.splitlines()[0]  # the --model given
