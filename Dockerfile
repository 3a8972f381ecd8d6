# syntax=docker/dockerfile:1
# NVIDIA's PyTorch container brings CUDA, torch, Transformer Engine, flash-attn, apex and DALI, built for each
# other; this image adds the megatron-core release that matches the container's Transformer Engine, and this
# package, without letting pip replace any of the container's builds.
#
#   docker build -t megatron-neobert .                                            # 26.06: megatron-core 0.19.2
#   docker build --build-arg NGC_IMAGE=nvcr.io/nvidia/pytorch:25.11-py3 -t megatron-neobert:mc0.16 .  # 0.16.1
#   docker run --gpus all --ipc=host --rm -it -v $PWD/data:/data megatron-neobert bash examples/quickstart.sh
#
# Which megatron-core (megatron_neobert/install/releases.py declares them, install/te_support.py chooses; docs/gpu.md):
# the newest supported release whose needs the container's TE meets: CPython (0.19.2: >=3.12), TE's base release at or
# above the oldest tested (0.19.2: 2.17; 0.16.1: 2.9) and below a declared bound (0.16.1: <2.12, so 2.12.0a0 is
# refused), and every TE name the release needs, with the keywords this project's layers pass, there on import (no GPU
# needed). So 25.11 -> 0.16.1; 26.06, 26.08, 26.09 and later -> 0.19.2. Run on a GPU: NGC 25.11 (TE 2.9) with 0.16.1; TE
# 2.17.1 with 0.19.2 on the GPU host; NGC 26.06 (TE 2.17.1) with 0.19.2 is the pair NVIDIA tested. Only read, not run:
# 26.08, 26.09 (TE 2.19.0), TE 2.20.2.
# MEGATRON_CORE=auto picks; 0.16.1 or 0.19.2 checks that one alone. A TE that fits none fails the build here, not the
# first training step.
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

# Which megatron-core: written to /tmp/megatron-core.txt, each release refused in one line.
RUN python -m megatron_neobert.install.te_support --megatron-core "$MEGATRON_CORE" --choose /tmp/megatron-core.txt

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
