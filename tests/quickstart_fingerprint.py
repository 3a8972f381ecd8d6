"""README's first command, examples/quickstart.sh, run as a user would, and a fingerprint of what it produced:
what a change of code layout must leave bit-identical.

    python tests/quickstart_fingerprint.py FOLDER                    # a 12-step quickstart into FOLDER/qs, then its
    python tests/quickstart_fingerprint.py FOLDER --train-iters 300  # fingerprint (FOLDER must hold no run yet)
    python tests/quickstart_fingerprint.py FOLDER --no-run           # the fingerprint of the run already in FOLDER/qs

One line per item, sorted: the training curves from TensorBoard (``curve/<tag>/<step> <float32 value>``), SHA-256 of
every tensor of every checkpoint (model, optimizer state, RNG states; ``checkpoint/<iteration>/<key>``) and of every
tensor of the exported model.safetensors (``export/<name>``). Two fingerprints are compared line by line with diff.
"""

import argparse
import glob
import hashlib
import io
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict

import numpy
import torch

from megatron_neobert.megatron_core_compat import load_common_state

REPO = Path(__file__).resolve().parents[1]
# The curves that show a change of numerics first; the others (learning rate, batch size, throughput) do not.
CURVE_TAGS = ("lm loss", "grad-norm", "lm loss validation")


def run_quickstart(folder: Path, train_iters, *flags) -> subprocess.CompletedProcess:
    """The quickstart into folder/qs, from folder, on 2 ranks, as a cluster shell would run it (MASTER_PORT
    exported); extra arguments go to the trainer."""
    with socket.socket() as s:  # a free port for torchrun's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, WORK_DIR=str(folder / "qs"), TRAIN_ITERS=str(train_iters), NPROC="2",
               MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    env.pop("RANK", None)
    return subprocess.run(["bash", str(REPO / "examples" / "quickstart.sh"), *flags], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=900)


def _digest(value) -> str:
    if isinstance(value, torch.Tensor):
        value = value.detach().contiguous().numpy()
    data = numpy.ascontiguousarray(value)
    return hashlib.sha256(f"{data.dtype}{data.shape}".encode() + data.tobytes()).hexdigest()


def _tensor_digests(obj, prefix: str, out: Dict[str, str]) -> None:
    """SHA-256 of each tensor or array in a nested state, keyed by its path; other leaves (paths, flags) left out."""
    if isinstance(obj, (torch.Tensor, numpy.ndarray)):
        out[prefix] = _digest(obj)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _tensor_digests(value, f"{prefix}/{key}", out)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _tensor_digests(value, f"{prefix}/{i}", out)
    elif isinstance(obj, io.BytesIO):
        out[prefix] = hashlib.sha256(obj.getvalue()).hexdigest()


def curves(tensorboard_dir: Path) -> Dict[str, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for events in sorted(glob.glob(str(tensorboard_dir / "events.out.tfevents.*"))):
        if events.endswith(".downstream"):  # the watcher's scores, not the trainer's
            continue
        acc = EventAccumulator(events, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in CURVE_TAGS:
            if tag in acc.Tags()["scalars"]:
                out.update({f"curve/{tag}/{e.step:07d}": repr(e.value) for e in acc.Scalars(tag)})
    return out


def checkpoint_digests(iteration_dir: Path) -> Dict[str, str]:
    """Every tensor of a megatron-core distributed checkpoint, read without a process group, and of common.pt."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(iteration_dir, os.path.join(tmp, "state.pt"))
        _tensor_digests(torch.load(os.path.join(tmp, "state.pt"), weights_only=False), "", out)
    # common.pt's args name this run's folders; its tensors (the optimizer's step) are the state that matters
    _tensor_digests(load_common_state(str(iteration_dir)), "/common.pt", out)
    return {f"checkpoint/{iteration_dir.name}{key}": digest for key, digest in out.items()}


def export_digests(safetensors_file: Path) -> Dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(safetensors_file), framework="pt") as f:
        return {f"export/{name}": _digest(f.get_tensor(name)) for name in f.keys()}


def fingerprint(work_dir: Path) -> Dict[str, str]:
    """The fingerprint of the quickstart run in work_dir (its WORK_DIR)."""
    out = curves(work_dir / "tensorboard")
    for iteration_dir in sorted((work_dir / "checkpoints").glob("iter_*")):
        out.update(checkpoint_digests(iteration_dir))
    out.update(export_digests(work_dir / "hf" / "model.safetensors"))
    return dict(sorted(out.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="where the quickstart runs; its outputs go to FOLDER/qs")
    parser.add_argument("--train-iters", type=int, default=12, help="TRAIN_ITERS of the quickstart (default 12)")
    parser.add_argument("--no-run", action="store_true", help="fingerprint the run already in FOLDER/qs")
    args = parser.parse_args()
    folder = args.folder.resolve()
    if not args.no_run:
        if (folder / "qs").exists():
            sys.exit(f"error: {folder / 'qs'} exists: the quickstart would resume it; give an empty folder")
        folder.mkdir(parents=True, exist_ok=True)
        out = run_quickstart(folder, args.train_iters, "--save-interval", str(max(1, args.train_iters // 2)))
        if out.returncode:
            sys.exit(out.stdout[-3000:] + out.stderr[-3000:] + f"\nerror: the quickstart failed ({out.returncode})")
    for key, value in fingerprint(folder / "qs").items():
        print(key, value)


if __name__ == "__main__":
    main()
