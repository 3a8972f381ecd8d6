"""Importing the package changes nothing in the process: no import hook, warning filter, logging handler, torch
patch or torch function mode, safe-globals entry or environment variable appears, and transformers' Auto classes
gain `neobert` alone (`import megatron_neobert.hf` registering it is its documented purpose; the conversion and
evaluation modules import it). The libraries it imports (torch, megatron-core, transformers, scikit-learn, ...) are
imported first, every module of them that importing the package loads, so that what they do at their own import is
not counted."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # a fresh interpreter importing every module

PROBE = r"""
import importlib, importlib.util, json, logging, os, pkgutil, sys, warnings

for name in json.loads(sys.stdin.read()):  # the libraries' own import-time effects happen here
    try:
        importlib.import_module(name)
    except Exception:
        pass
import torch
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

def state():
    return dict(meta_path=[repr(f) for f in sys.meta_path], warnings=[repr(f) for f in warnings.filters],
                root_handlers=[repr(h) for h in logging.getLogger().handlers],
                package_level=logging.getLogger("megatron_neobert").level,
                cuda=[repr(getattr(torch.cuda, n)) for n in ("current_device", "synchronize", "get_rng_state",
                                                              "set_rng_state", "manual_seed")],
                function_modes=torch._C._len_torch_function_stack(),
                safe_globals=[repr(g) for g in torch.serialization.get_safe_globals()],
                environ=sorted(os.environ.items()),
                auto_configs=sorted(CONFIG_MAPPING.keys()))

package = importlib.util.find_spec("megatron_neobert").submodule_search_locations  # finding it imports nothing
before = state()
import megatron_neobert
skipped = []
for module in pkgutil.walk_packages(package, "megatron_neobert."):
    if module.name.rsplit(".", 1)[-1].startswith("modular_"):
        continue  # the modular converter's source, in transformers' package layout: not imported
    try:
        importlib.import_module(module.name)
    except ImportError as err:  # an optional package (DALI, ...) absent here
        skipped.append(f"{module.name}: {err}")
after = state()
print(json.dumps(dict(changed={k: [before[k], after[k]] for k in before if before[k] != after[k]},
                      skipped=skipped,
                      imported=len([m for m in sys.modules if m.startswith("megatron_neobert")]),
                      libraries=[m for m in sys.modules if m.split(".")[0] not in ("megatron_neobert", "__main__")])))
"""


def probe(libraries):
    import json

    done = subprocess.run([sys.executable, "-c", PROBE], input=json.dumps(libraries), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_every_module_changes_nothing_process_wide():
    # First pass: which library modules the package's import loads; second: those first, then the package.
    report = probe(probe([])["libraries"])
    configs_before, configs_after = report["changed"].pop("auto_configs")
    assert sorted(set(configs_after) - set(configs_before)) == ["neobert"]  # megatron_neobert.hf's registration
    assert report["changed"] == {}, report["changed"]
    assert report["imported"] > 60, report  # every module was imported (the optional ones aside)
    assert all("dali" in line for line in report["skipped"]), report["skipped"]
