"""Checkpoints across megatron-core releases: a run saved on 0.16 resumes on 0.19 as it would have gone on, the
HF export of a checkpoint is the same file from either release, and 0.16 refuses a 0.19 checkpoint in one line.

These need both releases: they run on the 0.19 lane (CPython 3.12), with NEOBERT_MEGATRON_CORE_0_16_PYTHON naming
a Python whose environment has megatron-core 0.16 and this package (`.ci/run` gives the default lane's); the
0.16 side runs there, in a subprocess."""

import json
import os
import subprocess

import pytest
from safetensors.torch import load_file

from megatron_neobert.megatron_core_compat import RELEASE
from megatron_neobert.checkpoint.layout import iteration_dir
from pretrain_cases import run_train, tiny_argv

OTHER_PYTHON = os.environ.get("NEOBERT_MEGATRON_CORE_0_16_PYTHON")
TESTS = os.path.dirname(os.path.abspath(__file__))
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(RELEASE < (0, 19) or not OTHER_PYTHON,
                       reason="needs megatron-core 0.19 here and NEOBERT_MEGATRON_CORE_0_16_PYTHON (the 0.19 lane)"),
]

TRAIN_ON_OTHER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pretrain_cases import run_train
history = run_train(json.loads(sys.argv[2]))
print("HISTORY " + json.dumps({"train": [{"iteration": r["iteration"], "loss": r["loss"]} for r in history["train"]]}))
"""


def on_megatron_core_0_16(*args: str, expect_failure: bool = False) -> subprocess.CompletedProcess:
    out = subprocess.run([OTHER_PYTHON, *args], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": TESTS})
    assert (out.returncode != 0) == expect_failure, out.stderr[-3000:]
    return out


def train_on_megatron_core_0_16(argv: list) -> dict:
    out = on_megatron_core_0_16("-c", TRAIN_ON_OTHER, TESTS, json.dumps(argv))
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("HISTORY ")]
    return json.loads(line[len("HISTORY "):])


def losses(history: dict, after: int = 0) -> list:
    return [r["loss"] for r in history["train"] if r["iteration"] > after]


def argv(data, *extra: str) -> list:
    return tiny_argv(data[0], data[1], "--lr-decay-iters", "20", "--train-iters", "8", *extra)


@pytest.fixture(scope="module")
def saved_on_0_16(data, tmp_path_factory):
    """(history, checkpoint root) of 8 steps trained and saved every 4 on megatron-core 0.16."""
    root = str(tmp_path_factory.mktemp("on_0_16") / "ckpt")
    return train_on_megatron_core_0_16(argv(data, "--save", root, "--save-interval", "4")), root


def test_a_run_saved_on_0_16_resumes_on_0_19_as_it_went_on(saved_on_0_16, data, tmp_path):
    reference, root = saved_on_0_16
    resumed = run_train(argv(data, "--load", root, "--ckpt-step", "4", "--save", str(tmp_path / "resumed")))
    print("", "step  0.16 uninterrupted  0.19 resumed from 0.16's step 4", *(
        f"{step:>4}  {a!r:>20}  {b!r:>20}" for step, a, b in zip(range(5, 9), losses(reference, 4), losses(resumed))),
        sep="\n")
    assert losses(resumed) == losses(reference, 4)


def test_both_releases_train_and_export_the_same_model(saved_on_0_16, data, tmp_path):
    from megatron_neobert.conversion.convert import mcore_to_hf

    reference, root_0_16 = saved_on_0_16
    root_0_19 = str(tmp_path / "on_0_19")
    here = run_train(argv(data, "--save", root_0_19, "--save-interval", "4"))
    assert losses(here) == losses(reference)
    mcore_to_hf(iteration_dir(root_0_16, 8), tmp_path / "hf_0_16_read_on_0_19")
    mcore_to_hf(iteration_dir(root_0_19, 8), tmp_path / "hf_0_19")
    on_megatron_core_0_16(os.path.join(os.path.dirname(TESTS), "tools", "convert_checkpoint.py"), "--direction",
                          "mcore-to-hf", "--load", iteration_dir(root_0_16, 8), "--save",
                          str(tmp_path / "hf_0_16_read_on_0_16"))
    exports = [load_file(tmp_path / name / "model.safetensors")
               for name in ("hf_0_16_read_on_0_16", "hf_0_16_read_on_0_19", "hf_0_19")]
    assert all(export.keys() == exports[0].keys() for export in exports)
    assert all(export[key].equal(exports[0][key]) for export in exports[1:] for key in exports[0])


def test_a_0_19_checkpoint_is_refused_on_0_16_in_one_line(data, tmp_path):
    root = str(tmp_path / "ckpt")
    run_train(argv(data, "--train-iters", "2", "--save", root))
    out = on_megatron_core_0_16("-m", "megatron_neobert.pretrain", *argv(data, "--train-iters", "4", "--load", root,
                                                                        "--save", str(tmp_path / "elsewhere")),
                                expect_failure=True)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    print(*errors, sep="\n")
    assert errors == [f"error: checkpoint {iteration_dir(root, 2)}: saved by megatron-core 0.19 or later (its common "
                      f"state is in the .distcp files, there is no common.pt), which megatron-core 0.16.1 cannot read: "
                      f"load it with megatron-core 0.19 (CPython 3.12)"]
