"""A half-installed Transformer Engine: megatron-core's import fails on it, and the trainer's entry point says why in
one line first. Each case runs in a fresh interpreter with a fake `transformer_engine` package first on sys.path."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # each case imports megatron-core in a fresh interpreter

# TE's top-level __init__ imports its PyTorch part as this one does, warning (not raising) on a missing
# shared object; transformer_engine.pytorch's load_framework_extension raises the errors below.
TE_INIT = '''
import warnings
__version__ = "2.11.0"
try:
    from . import pytorch
except ImportError:
    pass
except FileNotFoundError as e:
    warnings.warn("could not find the shared object file of the PyTorch extension", RuntimeWarning)
'''
VERSION_MISMATCH = ('AssertionError("Transformer Engine package version mismatch. Found transformer_engine_torch '
                    'v2.10.0, transformer-engine v2.11.0, and transformer-engine-cu13 v2.11.0.")')
NO_EXTENSION = 'FileNotFoundError("Could not find shared object file for Transformer Engine torch lib.")'
NO_CUDA_LIBRARY = 'ImportError("libcudart.so.13: cannot open shared object file")'
NO_MODULE = 'ModuleNotFoundError("No module named \'transformer_engine_torch\'")'


def python_with_fake_te(tmp_path, pytorch_raises: str, code: str, init: str = TE_INIT):
    package = tmp_path / "transformer_engine"
    (package / "pytorch").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(init)
    (package / "pytorch" / "__init__.py").write_text(f"raise {pytorch_raises}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("pytorch_raises, error", [
    (VERSION_MISMATCH, "AssertionError: Transformer Engine package version mismatch. Found transformer_engine_torch "
                       "v2.10.0, transformer-engine v2.11.0, and transformer-engine-cu13 v2.11.0."),
    (NO_EXTENSION, "FileNotFoundError: Could not find shared object file for Transformer Engine torch lib."),
    # megatron-core's tensor_parallel/random.py guards its TE import with `except ModuleNotFoundError` only.
    (NO_CUDA_LIBRARY, "ImportError: libcudart.so.13: cannot open shared object file"),
    # Once transformer_engine imports, megatron-core's fp8_utils imports transformer_engine.pytorch unguarded.
    (NO_MODULE, "ModuleNotFoundError: No module named 'transformer_engine_torch'"),
])
def test_a_broken_te_is_named_in_one_line_before_megatron_core_fails(tmp_path, pytorch_raises, error):
    bare = python_with_fake_te(tmp_path, pytorch_raises, "import megatron.core")
    assert bare.returncode == 1 and bare.stderr.strip().splitlines()[-1] == error  # megatron-core lets it through
    ours = python_with_fake_te(tmp_path, pytorch_raises, "import sys, megatron_neobert.pretrain as p; "
                               "sys.exit(p.main(['--mock-data', '--model-preset', 'neobert-tiny']))")
    assert ours.returncode == 1 and "Traceback" not in ours.stderr, ours.stderr
    assert ours.stderr.strip().splitlines()[-1] == (
        f"error: Transformer Engine is installed but does not "
        f"load ({error}), so megatron-core cannot be imported: install transformer-engine, "
        "transformer-engine-cu13 and transformer-engine-torch of one version, the last built against this "
        "torch (docs/gpu.md), or uninstall transformer-engine to use the PyTorch layers")


def test_a_te_whose_top_level_misses_a_module_leaves_megatron_core_on_its_pytorch_paths(tmp_path):
    result = python_with_fake_te(
        tmp_path, NO_MODULE, "import megatron_neobert.kernels as k; print(k.transformer_engine_available())",
        init=f"raise {NO_MODULE}\n")
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr
