from setuptools import find_namespace_packages, setup

# megatron_neobert/extras.py names each extra's modules for the commands' one-line refusals; tests/test_extras.py
# holds the two lists together.
EVAL = ["scipy", "scikit-learn", "datasets", "sentence-transformers", "mteb>=2"]
# The container and the GPU hosts are CUDA 13; the cuda130 wheel's CPU pipelines also run on a machine without a GPU
# or CUDA driver (2.4.0 checked on one), so the test install (CI) keeps it.
DALI = ["nvidia-dali-cuda130"]
# transformers' common model tests (tests/test_hf_transformers_common.py) were reviewed against this release: the test
# extra pins it so that a new upstream test cannot turn CI red; tests/check_transformers_release.sh tries the newest.
REVIEWED_TRANSFORMERS = "5.24.0"

setup(
    name="megatron_neobert",
    version="0.1.0",
    description="Pre-train NeoBERT encoders with megatron-core: data, training, conversion, evaluation.",
    # Namespace packages too: the data folders (assets/, assets/tokenizer/) are packages to setuptools.
    packages=find_namespace_packages(include=["megatron_neobert", "megatron_neobert.*"],
                                     exclude=["*.__pycache__"]),
    # native.c: the data path's C helpers, compiled at first use (data/datasets/native.py).
    package_data={"megatron_neobert.assets": ["*"], "megatron_neobert.assets.tokenizer": ["*"],
                  "megatron_neobert.data.datasets": ["native.c"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.6",  # megatron-core 0.16's own floor
        # 0.16 (CPython 3.10+) and 0.19 (CPython 3.12+; 0.17 on need 3.12): megatron_core_compat.py holds every
        # difference between them; 0.17 and 0.18 are refused there at import, so pip is told to skip them.
        "megatron-core>=0.16,!=0.17.*,!=0.18.*,<0.20",
        "numpy",
        "packaging",
        "pyyaml",
        "tqdm",
        "psutil",
        "tensorboard",
        "safetensors",
        "tokenizers",
        # The HF modeling file's helpers (capture_outputs, create_bidirectional_mask, the attention interface's
        # get_interface) are all in transformers from 5.2.0 on.
        "transformers>=5.2",
        "sentencepiece",
        "pyarrow",
        "zstandard",
        "einops",
        "matplotlib",  # the pseudo-perplexity plot, the quickstart's last step
    ],
    extras_require={
        # GPU-only extras (transformer-engine, flash-attn, apex, DALI) come with the NGC container and are
        # imported lazily; apex is never listed because the registry package of that name is unrelated.
        # GLUE metrics, MTEB, sentence-transformers exports: ~270 MB, not needed to pre-train.
        "eval": EVAL,
        # The optional DALI loader (~590 MB of CUDA libraries); its CPU pipelines also run without a GPU, so the
        # test install keeps it and CI tests it; without it that test skips.
        "dali": DALI,
        # Weights & Biases logging (--wandb-project), as Megatron-LM's.
        "wandb": ["wandb"],
        # tools/preprocess_data.py --split-sentences (NLTK punkt; its model is a separate download:
        # python -m nltk.downloader punkt_tab).
        "data": ["nltk"],
        # parameterized: transformers' common model tests, run on our HF model, import it.
        "test": ["pytest", "pytest-xdist", "parameterized", "wandb", "nltk",
                 f"transformers=={REVIEWED_TRANSFORMERS}"] + EVAL + DALI,
    },
    # The commands of the library (tools/NAME.py runs the same one from a checkout); the benchmarks and the
    # sample-corpus builder stay scripts in tools/, the project's harness.
    entry_points={"console_scripts": [
        "neobert-pretrain=megatron_neobert.pretrain:cli",
        "neobert-preprocess-data=megatron_neobert.cli.preprocess_data:main",
        "neobert-merge-datasets=megatron_neobert.cli.merge_datasets:main",
        "neobert-build-data-cache=megatron_neobert.cli.build_data_cache:main",
        "neobert-make-length-subset=megatron_neobert.cli.make_length_subset:main",
        "neobert-convert-checkpoint=megatron_neobert.cli.convert_checkpoint:main",
        "neobert-run-glue=megatron_neobert.cli.run_glue:cli",
        "neobert-pseudo-perplexity=megatron_neobert.cli.pseudo_perplexity:cli",
        "neobert-finetune-contrastive=megatron_neobert.cli.finetune_contrastive:cli",
        "neobert-run-mteb=megatron_neobert.cli.run_mteb:cli",
        "neobert-finetune-cde=megatron_neobert.cli.finetune_cde:cli",
        "neobert-watch-run=megatron_neobert.cli.watch_run:main",
        "neobert-stage2-plan=megatron_neobert.cli.stage2_plan:main",
        "neobert-goodput-model=megatron_neobert.cli.goodput_model:main",
    ]},
)
