# syntax=docker/dockerfile:1
# NVIDIA's PyTorch container brings CUDA, torch, Transformer Engine, flash-attn, apex and DALI,
# built for each other; this image adds megatron-core and this package on top, without letting
# pip replace any of them.
#
#   docker build -t megatron-neobert .
#   docker run --gpus all --ipc=host --rm -it -v $PWD/data:/data megatron-neobert \
#       bash examples/quickstart.sh
# megatron-core 0.16.1 declares transformer-engine >=2.9,<2.12 for CUDA 13; 25.11 is the NGC PyTorch
# release carrying TE 2.9 on CUDA 13.0 (see docs/gpu.md). The build checks the range below, so another
# BASE_IMAGE with a TE outside it fails here, not on the first step.
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.11-py3
FROM ${BASE_IMAGE}

WORKDIR /workspace/megatron_neobert
COPY . .

# Pin the container's builds (their versions carry local tags such as 2.9.0a0+...nv25.11), so
# that the install of this package and megatron-core adds only what the container lacks.
RUN python - > /tmp/container-builds.txt <<'PY'
import importlib.metadata as md
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name and name.lower().replace("_", "-").startswith(
            ("torch", "transformer-engine", "flash-attn", "apex", "nvidia-dali", "triton")):
        print(f"{name}=={dist.version}")
PY
RUN cat /tmp/container-builds.txt \
    && pip install --no-cache-dir --constraint /tmp/container-builds.txt . \
    && python -c "import torch, megatron.core, megatron_neobert.kernels as k; \
print('torch', torch.__version__, '| megatron-core', megatron.core.__version__); \
print({n: k.probe(n) for n in ('transformer_engine', 'flash_attn', 'apex', 'dali')})"

# The versions this image was made for: fail the build, not the first training step.
RUN python - <<'PY'
import importlib.metadata as md
import torch
import transformer_engine
from packaging.version import Version
te = Version(transformer_engine.__version__)
if not Version("2.9.0a0") <= te < Version("2.12.0"):
    raise SystemExit(f"transformer_engine {te} is outside megatron-core 0.16's range >=2.9,<2.12: "
                     f"pick another --build-arg BASE_IMAGE (docs/gpu.md)")
cuda = torch.version.cuda.split(".")[0]
names = [(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()]
dali = [name for name in names if name.startswith("nvidia-dali")]
if any(not name.endswith(f"cuda{cuda}0") for name in dali):
    raise SystemExit(f"{dali} does not match the container's CUDA {torch.version.cuda}")
print("transformer_engine", te, "| CUDA", torch.version.cuda, "| DALI", dali or "absent")
PY

# megatron-core overlaps its TP communication with compute when kernels are queued in order.
ENV CUDA_DEVICE_MAX_CONNECTIONS=1
CMD ["bash"]
