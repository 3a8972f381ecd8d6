# syntax=docker/dockerfile:1
# NVIDIA's PyTorch container brings CUDA, torch, Transformer Engine, flash-attn, apex and DALI,
# built for each other; this image adds megatron-core and this package on top, without letting
# pip replace any of them.
#
#   docker build -t megatron-neobert .
#   docker run --gpus all --ipc=host --rm -it -v $PWD/data:/data megatron-neobert \
#       bash examples/quickstart.sh
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.04-py3
FROM ${BASE_IMAGE}

WORKDIR /workspace/megatron_neobert
COPY . .

# Pin the container's builds (their versions carry local tags such as 2.7.0a0+...nv25.04), so
# that the install of this package and megatron-core keeps them.
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

# megatron-core overlaps its TP communication with compute when kernels are queued in order.
ENV CUDA_DEVICE_MAX_CONNECTIONS=1
CMD ["bash"]
