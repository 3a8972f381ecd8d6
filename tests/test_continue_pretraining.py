"""Continued pre-training of a released model, as docs/training.md shows it: examples/continue_pretraining.sh takes a
Hugging Face folder in the published layout whose shape is no preset's (2 x 128, SwiGLU from intermediate_size 512,
max_length 512), converts it, tokenizes a corpus with its tokenizer, continues pre-training with the released shape
and tokenizer (--use-checkpoint-args, no preset, no tokenizer flag), resumes, and exports a folder that
AutoModelForMaskedLM loads without remote code, its config the source's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_fixtures import VOCAB, make_neobert_folder

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "continue_pretraining.sh"


def run_recipe(work: Path, released: Path, train_iters: int, *extra: str) -> subprocess.CompletedProcess:
    from megatron_neobert.data.assets import SAMPLE_CORPUS

    env = dict(os.environ, RELEASED=str(released), CORPUS=SAMPLE_CORPUS, JSON_KEY="content", WORK_DIR=str(work),
               NPROC="1", TRAIN_ITERS=str(train_iters), GLOBAL_BATCH="4", MICRO_BATCH="4", SEQ_LENGTH="128",
               MASTER_PORT="29533", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    flags = ["--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1", "--num-workers", "0", *extra]
    return subprocess.run(["bash", str(SCRIPT), *flags], env=env, capture_output=True, text=True, timeout=900)


def test_a_released_checkpoint_of_no_preset_shape_continues_and_exports_as_its_source(tmp_path):
    released = make_neobert_folder(tmp_path / "released", hidden_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=512, max_length=512)
    work = tmp_path / "work"
    first = run_recipe(work, released, 4, "--exit-interval", "2")  # stopped early, as a pre-emption would
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert f"no checkpoint in --load {work}/checkpoints: starting from --pretrained-checkpoint" in first.stdout
    assert "model shape from the checkpoint's args (--use-checkpoint-args)" in first.stdout
    assert f"--tokenizer-model {released.resolve()}" in first.stdout  # the checkpoint's, said in the log
    assert "stopping at iteration 2 (exit-interval)" in first.stdout

    second = run_recipe(work, released, 4)  # the same command resumes from the run's own checkpoint
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert f"loaded {work}/checkpoints/iter_0000002 at iteration 2" in second.stdout
    assert "done: iteration 4 (finished)" in second.stdout + second.stderr

    from megatron_neobert.conversion.convert import read_checkpoint_args

    _, args = read_checkpoint_args(work / "released")  # what a tokenizer given to the run is compared with
    assert (args["tokenizer_model"], args["tokenizer_vocab_size"]) == (str(released.resolve()), len(VOCAB))
    source = json.loads((released / "config.json").read_text())
    exported = json.loads((work / "hf" / "config.json").read_text())
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_length",
             "vocab_size")
    assert {k: exported[k] for k in shape} == {k: source[k] for k in shape}  # 512 and 512, not 516 and 1024

    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    import megatron_neobert.hf  # noqa: F401  (registers NeoBERT with the Auto classes)

    model = AutoModelForMaskedLM.from_pretrained(work / "hf", trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(work / "hf")
    batch = tokenizer(["the model reads a long text"], return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (1, batch["input_ids"].shape[1], source["vocab_size"]) and torch.isfinite(logits).all()
