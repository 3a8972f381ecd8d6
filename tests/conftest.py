import os
import sys

import pytest
import torch

# Spawned ranks import the helpers in tests/ by module name.
sys.path.insert(0, os.path.dirname(__file__))
from shared_runs import run_once  # noqa: E402
from rank_preload import TRAINER_AND_CONVERTER  # noqa: E402
from time_budget import TimeBudget, pytest_addoption  # noqa: E402,F401 (a hook of this conftest)
from megatron_neobert.parallel.launch import preload_on_ranks  # noqa: E402

preload_on_ranks(*TRAINER_AND_CONVERTER)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The CPU tests also run with a CUDA build of torch on machines without a GPU.
os.environ.setdefault("NEOBERT_ALLOW_CPU", "1")
# One intra-op thread in each test worker and in what it starts: the tests' models are tiny, and two workers' threads
# spin against each other on shared cores (a fine-tune took 1.4 s with one thread, 260 s with two; the model and
# attention tests take 0.83x the CPU time). Set up once here, for the whole session.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    config.pluginmanager.register(TimeBudget(config), "time_budget")
    # The markers of transformers' common model tests (test_hf_transformers_common.py), registered
    # by transformers' own conftest, which its sdist does not ship.
    for marker in ("accelerate_tests", "flash_attn_test", "flash_attn_3_test", "flash_attn_4_test",
                   "torch_compile_test", "slow"):
        config.addinivalue_line("markers", f"{marker}: a marker of transformers' common model tests")


def pytest_report_header(config):
    from importlib.metadata import version

    return f"transformers {version('transformers')} (its common tests: tests/test_hf_transformers_common.py)"


def pytest_terminal_summary(terminalreporter):
    """Lists transformers' common tests that a release other than the reviewed one skips for a reason nobody has
    reviewed: a warning to read before pinning that release, not a failure."""
    unreviewed = sorted({f"{report.nodeid}: {report.longrepr[2]}" for reports in terminalreporter.stats.values()
                         for report in reports if getattr(report, "skipped", False)
                         and isinstance(report.longrepr, tuple) and "not reviewed for transformers" in report.longrepr[2]})
    if unreviewed:
        terminalreporter.write_sep("=", f"{len(unreviewed)} transformers common tests skipped, not reviewed")
        for line in unreviewed:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def distributed_state_of_the_session():
    """What of torch.distributed and megatron-core's parallel state the tests of a worker create in its process is
    destroyed at the end of the session (each gloo group holds threads and sockets)."""
    from megatron_neobert.parallel.launch import DistributedState

    found = DistributedState()
    yield
    found.release()


@pytest.fixture
def cpu_execution():
    """megatron-core's CUDA calls on the CPU for the test (a no-op with a GPU), as the trainer's entry point runs."""
    from megatron_neobert.parallel.cpu import cpu_execution

    with cpu_execution():
        yield


@pytest.fixture
def single_rank(cpu_execution, distributed_state_of_the_session):
    """megatron-core parallel state for one CPU rank, inside the test process, kept for the worker's next tests; made
    again where a trainer run in this process came before (a run destroys what it created)."""
    from megatron.core import parallel_state

    from megatron_neobert.parallel.launch import initialize_model_parallel

    if not parallel_state.model_parallel_is_initialized():
        initialize_model_parallel(1, 1, seed=1)


def preprocess_sample_corpus(folder) -> str:
    from megatron_neobert.data.assets import SAMPLE_CORPUS, SAMPLE_TOKENIZER
    from megatron_neobert.data.preprocessing.preprocess import preprocess_data

    stats = preprocess_data([SAMPLE_CORPUS], str(folder / "sample"), tokenizer_model=SAMPLE_TOKENIZER,
                            progress=False, json_keys=["content"])
    return stats.outputs["content"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The built-in sample corpus preprocessed for the trainer: (dataset prefix, cache folder). The corpus is
    preprocessed once per session and shared; the cache folder stays the module's own, so that what a test
    finds there does not depend on which other modules ran first in its worker."""
    prefix = run_once(tmp_path_factory, "data", preprocess_sample_corpus)
    return prefix, str(tmp_path_factory.mktemp("data") / "cache")
