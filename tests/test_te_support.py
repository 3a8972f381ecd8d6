"""The Dockerfile's choice of megatron-core (megatron_neobert.install.te_support) over the TE versions of NVIDIA's
images, each a fake `transformer_engine` package that provides what the case says; the shipped lists of TE names
against a fresh read of the installed megatron-core."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megatron_neobert.install import te_support

OLD, NEW = (te_support.shipped_api(release) for release in ("0.16.1", "0.19.2"))
BOTH = {**OLD, **{name: sorted(set(OLD.get(name, [])) | set(keywords)) for name, keywords in NEW.items()}}
ONLY_NEW = sorted(set(NEW) - set(OLD))
# Built from api.json: each name below the package a function (which can carry attributes) taking the listed keywords.
FAKE_INIT = '''
import inspect, json, os, sys

def _signature(keywords):
    return inspect.Signature([inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in keywords])

def _node():
    def node(*args, **kwargs):
        pass
    return node

with open(os.path.join(os.path.dirname(__file__), "api.json")) as f:
    for name, keywords in json.load(f).items():
        here = sys.modules[__name__]
        for part in name.split(".")[1:]:
            if not hasattr(here, part):
                setattr(here, part, _node())
            here = getattr(here, part)
        if here is not sys.modules[__name__]:
            here.__signature__ = _signature(keywords)
'''


def fake_te(root: Path, version: str, api: dict) -> Path:
    """A `transformer_engine` package under `root` that provides `api` ({name: keywords}), installed as `version`."""
    package = root / "transformer_engine"
    package.mkdir(parents=True)
    (package / "api.json").write_text(json.dumps(api))
    (package / "__init__.py").write_text(FAKE_INIT)
    info = root / f"transformer_engine-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformer_engine\nVersion: {version}\n")
    return root


@pytest.fixture
def te_from(tmp_path, monkeypatch):
    """Makes a fake TE the importable one for this test, in this process."""
    def install(version: str, api: dict) -> None:
        monkeypatch.syspath_prepend(str(fake_te(tmp_path, version, api)))
        for name in [n for n in sys.modules if n.split(".")[0] == "transformer_engine"]:
            monkeypatch.delitem(sys.modules, name)
    yield install
    for name in [n for n in sys.modules if n.split(".")[0] == "transformer_engine"]:
        del sys.modules[name]


def without(api: dict, name: str) -> dict:
    return {n: k for n, k in api.items() if n != name}


def without_keyword(api: dict, name: str, keyword: str) -> dict:
    return {**api, name: [k for k in api[name] if k != keyword]}


LAYER_NORM_LINEAR = "transformer_engine.pytorch.LayerNormLinear"
# (TE version, what it provides, CPython, requested, the answer, what the refusals must say)
CASES = [
    ("2.9.0a0+abc.nv25.11", OLD, (3, 12), "auto", "0.16.1", ["0.19.2 refused", ">=2.17", ONLY_NEW[0]]),
    ("2.11.0", OLD, (3, 12), "auto", "0.16.1", ["needs transformer_engine >=2.17", ONLY_NEW[0]]),
    ("2.11.0", OLD, (3, 10), "auto", "0.16.1", ["needs CPython >=3.12"]),
    ("2.17.1", BOTH, (3, 12), "auto", "0.19.2", []),
    ("2.18.0", BOTH, (3, 12), "auto", "0.19.2", []),
    ("2.18.0a0+f00.nv26.07", BOTH, (3, 12), "auto", "0.19.2", []),
    ("2.19.0", BOTH, (3, 12), "auto", "0.19.2", []),
    ("2.20.2", BOTH, (3, 12), "auto", "0.19.2", []),
    # a pre-release judged on its names: without 0.19.2's it gets nothing, and never slips under 0.16.1's bound
    ("2.18.0a0+f00.nv26.07", OLD, (3, 12), "auto", None, [ONLY_NEW[0], "declares transformer_engine <2.12"]),
    ("2.12.0a0", OLD, (3, 12), "auto", None, ["0.16.1 refused", "declares transformer_engine <2.12"]),
    ("2.20.2", without(BOTH, ONLY_NEW[0]), (3, 12), "auto", None, [f"lacks 1 of what it calls: {ONLY_NEW[0]}"]),
    ("2.20.2", without_keyword(BOTH, LAYER_NORM_LINEAR, "return_layernorm_output"), (3, 12), "auto", None,
     [f"{LAYER_NORM_LINEAR}(return_layernorm_output=)"]),
    ("2.19.0", BOTH, (3, 11), "auto", None, ["0.19.2 refused for transformer_engine 2.19.0: needs CPython >=3.12, "
                                             "this is 3.11"]),
    ("2.19.0", BOTH, (3, 12), "0.16.1", None, ["0.16.1 refused", "declares transformer_engine <2.12"]),
    ("2.11.0", BOTH, (3, 12), "0.16.1", "0.16.1", []),
]


@pytest.mark.parametrize("te_version, api, python, requested, answer, says", CASES,
                         ids=[f"{c[0]}-{len(c[1])}names-py{c[2][1]}-{c[3]}" for c in CASES])
def test_choice_by_te_version(te_from, te_version, api, python, requested, answer, says):
    te_from(te_version, api)
    release, reasons = te_support.choose_megatron_core(te_version, python, requested=requested)
    assert release == answer, reasons
    for words in says:
        assert any(words in line for line in reasons), (words, reasons)
    assert all("\n" not in line for line in reasons)


def test_the_dockerfile_step(tmp_path):
    """The command as the Dockerfile runs it, before megatron-core is installed: a 2.9 NGC build gets 0.16.1 (on
    either CPython), a 2.19 without 0.19.2's names fails the build in an error: line."""
    def choose(version: str, api: dict):
        root = fake_te(tmp_path / version, version, api)
        out = tmp_path / f"{version}.txt"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(Path(te_support.__file__).parents[2])]))
        # as `python -m megatron_neobert.install.te_support --choose FILE`: neither torch nor megatron-core imported
        code = ("import sys; from megatron_neobert.install.te_support import main; rc = main(sys.argv[1:]); "
                "assert not {'torch', 'megatron.core'} & set(sys.modules); sys.exit(rc)")
        run = subprocess.run([sys.executable, "-c", code, "--choose", str(out)], env=env, capture_output=True,
                             text=True, timeout=120)
        return run, out

    run, out = choose("2.9.0a0+abc.nv25.11", OLD)
    assert run.returncode == 0, run.stderr
    assert out.read_text() == "0.16.1"
    assert run.stdout.startswith("transformer_engine 2.9.0a0+abc.nv25.11 | CPython ")
    run, out = choose("2.19.0", OLD)
    assert run.returncode == 1 and not out.exists()
    assert run.stderr.splitlines()[-1].startswith("error: transformer_engine 2.19.0 with CPython")


def test_scanner_reads_what_megatron_core_needs(tmp_path):
    """What the scanner lists and leaves out, on a file written as megatron-core writes them."""
    (tmp_path / "m.py").write_text(textwrap.dedent('''
        try:
            import transformer_engine as te
            from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
            HAVE_TE = True
        except ImportError:
            HAVE_TE = False
        try:
            from transformer_engine.pytorch.attention import _SplitAlongDim
            SplitAlongDim = _SplitAlongDim.apply
        except ImportError:
            SplitAlongDim = None
        if is_te_min_version("2.3.0"):
            from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb
        class TELinear(te.pytorch.Linear):
            def __init__(self):
                super().__init__(in_features=1, bias=False, **extra)
                te.pytorch.module.base.Hook.value = 1
            def forward(self, x):
                return super().forward(x, is_first_microbatch=True)
        FP8GlobalStateManager.is_fp8_enabled(strict=True)
    '''))
    assert te_support.scan_te_api(tmp_path) == {
        "transformer_engine": [],
        "transformer_engine.pytorch.Linear": ["bias", "in_features"],
        "transformer_engine.pytorch.Linear.forward": ["is_first_microbatch"],
        "transformer_engine.pytorch.fp8.FP8GlobalStateManager": [],
        "transformer_engine.pytorch.fp8.FP8GlobalStateManager.is_fp8_enabled": ["strict"],
        "transformer_engine.pytorch.module.base.Hook": [],
    }


def test_shipped_list_is_the_installed_megatron_cores():
    """Fails when a maintainer bumps megatron-core without `python -m megatron_neobert.install.te_support --write`."""
    release, root = te_support.installed_megatron_core()
    shipped = json.loads(te_support.api_path(release).read_text())
    assert shipped["megatron_core"] == te_support.scan_te_api(root), f"python -m {te_support.__name__} --write"
    assert shipped["project"] == te_support.project_te_api(te_support.PACKAGE_DIR, root)


def test_project_layers_needs_are_checked():
    """The TE classes behind the model's four TE layers (layer_specs) are on the list the choice checks."""
    release, root = te_support.installed_megatron_core()
    project = te_support.project_te_api(te_support.PACKAGE_DIR, root)
    layers = {"transformer_engine.pytorch." + name for name in ("LayerNormLinear", "Linear", "DotProductAttention")}
    assert layers <= set(project)
    assert project["transformer_engine.pytorch.DotProductAttention"], "no keywords read from TEDotProductAttention"
    assert set(project) <= set(te_support.shipped_api(release))
