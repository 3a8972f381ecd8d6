from setuptools import find_packages, setup

setup(
    name="megatron_neobert",
    version="0.1.0",
    description="Pre-train NeoBERT encoders with megatron-core: data, training, conversion, evaluation.",
    packages=find_packages(include=["megatron_neobert", "megatron_neobert.*"]),
    include_package_data=True,
    package_data={"megatron_neobert": ["assets/*", "assets/**/*"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",
        "megatron-core>=0.16,<0.17",
        "numpy",
        "packaging",
        "pyyaml",
        "tqdm",
        "psutil",
        "tensorboard",
        "safetensors",
        "tokenizers",
        "transformers>=4.48",
        "sentencepiece",
        "pyarrow",
        "zstandard",
        "einops",
    ],
    extras_require={
        # GPU-only extras (transformer-engine, flash-attn, apex, DALI) come with the NGC container and are
        # imported lazily; apex is never listed because the registry package of that name is unrelated.
        "eval": ["scipy", "scikit-learn", "matplotlib", "datasets", "sentence-transformers", "mteb>=2"],
        # The optional DALI loader; its CPU-only pipelines also run (and are tested) without a GPU.
        "dali": ["nvidia-dali-cuda120"],
        # Weights & Biases logging (--wandb-project), as Megatron-LM's.
        "wandb": ["wandb"],
        "test": ["pytest", "pytest-xdist", "scipy", "scikit-learn", "matplotlib", "datasets",
                 "sentence-transformers", "mteb>=2", "zstandard", "nvidia-dali-cuda120", "wandb"],
    },
    entry_points={"console_scripts": ["neobert-pretrain=megatron_neobert.pretrain:main"]},
)
