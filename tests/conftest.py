import os
import sys

import pytest

# Spawned ranks import the helpers in tests/ by module name.
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def single_rank():
    """megatron-core parallel state for one CPU rank, inside the test process."""
    from megatron_neobert.parallel.launch import initialize_model_parallel

    initialize_model_parallel(1, 1, seed=1)
    yield
