# syntax=docker/dockerfile:1
# NVIDIA's PyTorch container brings CUDA, torch, Transformer Engine, flash-attn, apex and DALI, built for each
# other; this image adds the megatron-core release that matches the container's Transformer Engine, and this
# package, without letting pip replace any of the container's builds.
#
#   docker build -t megatron-neobert .                                            # 26.06: megatron-core 0.19.2
#   docker build --build-arg NGC_IMAGE=nvcr.io/nvidia/pytorch:25.11-py3 -t megatron-neobert:mc0.16 .  # 0.16.1
#   docker run --gpus all --ipc=host --rm -it -v $PWD/data:/data megatron-neobert bash examples/quickstart.sh
#
# The pairs this project supports (megatron_core_compat.py), by the container's TE (docs/gpu.md):
#   TE >=2.9,<2.12 -> megatron-core 0.16.1 (its declared range; NGC 25.11 carries TE 2.9 on CUDA 13.0)
#   TE 2.17.x      -> megatron-core 0.19.2 (CPython >=3.12; NVIDIA tested 0.19 with TE 2.17.1 and
#                     nvidia-resiliency-ext 0.6 in NGC PyTorch 26.06, whose asynchronous saves it uses)
# MEGATRON_CORE=auto picks by that table; 0.16.1 or 0.19.2 forces one (the checks still apply). Any other TE fails
# the build here, not the first training step.
ARG NGC_IMAGE=nvcr.io/nvidia/pytorch:26.06-py3
FROM ${NGC_IMAGE}
ARG MEGATRON_CORE=auto

WORKDIR /workspace/megatron_neobert
COPY . .

# Pin the container's builds (their versions carry local tags such as 2.9.0a0+...nv25.11), so that the install of
# this package and megatron-core adds only what the container lacks.
RUN python - > /tmp/container-builds.txt <<'PY'
import importlib.metadata as md
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name and name.lower().replace("_", "-").startswith(
            ("torch", "transformer-engine", "flash-attn", "apex", "nvidia-dali", "triton")):
        print(f"{name}=={dist.version}")
PY

# Which megatron-core: from the container's TE and CPython, or MEGATRON_CORE; written to /tmp/megatron-core.txt.
RUN python - <<'PY'
import importlib.metadata as md, os, sys
from packaging.version import Version
PAIRS = {  # megatron-core: (lowest TE, TE below this, lowest CPython)
    "0.16.1": (Version("2.9.0a0"), Version("2.12.0"), (3, 10)),
    "0.19.2": (Version("2.17.0a0"), Version("2.18.0"), (3, 12)),
}
try:
    te = Version(md.version("transformer-engine"))
except md.PackageNotFoundError:
    raise SystemExit(f"{os.environ.get('NGC_IMAGE', 'this image')} has no Transformer Engine: use an NGC PyTorch image")
te_release = Version(te.base_version)  # 2.9.0a0+abc.nv25.11 -> 2.9.0
want = os.environ.get("MEGATRON_CORE", "auto")
fits = lambda mc: PAIRS[mc][0] <= te < PAIRS[mc][1] or PAIRS[mc][0] <= te_release < PAIRS[mc][1]
if want == "auto":
    picks = [mc for mc in PAIRS if fits(mc)]
    if not picks:
        raise SystemExit(f"transformer_engine {te} fits no supported megatron-core "
                         + "; ".join(f"{mc}: TE >={lo},<{hi}" for mc, (lo, hi, _) in PAIRS.items())
                         + ": pick another --build-arg NGC_IMAGE (docs/gpu.md)")
    want = picks[-1]
elif want not in PAIRS:
    raise SystemExit(f"MEGATRON_CORE={want}: auto, or one of {', '.join(PAIRS)}")
elif not fits(want):
    lo, hi, _ = PAIRS[want]
    raise SystemExit(f"transformer_engine {te} is outside megatron-core {want}'s range >={lo},<{hi}")
if sys.version_info[:2] < PAIRS[want][2]:
    raise SystemExit(f"megatron-core {want} needs CPython >={'.'.join(map(str, PAIRS[want][2]))}, "
                     f"this image has {sys.version.split()[0]}")
open("/tmp/megatron-core.txt", "w").write(want)
print(f"transformer_engine {te} | CPython {sys.version.split()[0]} -> megatron-core {want}")
PY

RUN cat /tmp/container-builds.txt \
    && pip install --no-cache-dir --constraint /tmp/container-builds.txt \
        "megatron-core==$(cat /tmp/megatron-core.txt)" . \
    || { echo "pip failed: if it names a conflict with the container's /etc/pip/constraint.txt, that file pins" \
              "the package (NGC images since 25.03); see docs/gpu.md"; exit 1; }

# The versions this image was made for: fail the build, not the first training step.
RUN python - <<'PY'
import importlib.metadata as md
import torch, transformer_engine, transformer_engine.pytorch  # noqa: F401  (TE's torch extension loads)
import megatron.core
import megatron_neobert.kernels as k
cuda = torch.version.cuda.split(".")[0]
names = [(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()]
dali = [name for name in names if name.startswith("nvidia-dali")]
if any(not name.endswith(f"cuda{cuda}0") for name in dali):
    raise SystemExit(f"{dali} does not match the container's CUDA {torch.version.cuda}")
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| megatron-core", megatron.core.__version__,
      "| transformer-engine", transformer_engine.__version__, "| DALI", dali or "absent")
print({n: k.probe(n) for n in ("transformer_engine", "flash_attn", "apex", "dali")})
PY

# megatron-core overlaps its TP communication with compute when kernels are queued in order.
ENV CUDA_DEVICE_MAX_CONNECTIONS=1
CMD ["bash"]
