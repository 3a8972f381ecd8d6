"""megatron-core imported by the entry points (kernels.import_megatron_core) defers the torch.compile of its fused
kernels to their first call, the same compiled function without dynamo's and inductor's import in a process that
never calls one (a CPU rank, a tool), and leaves wandb out of its import: megatron-core's modules that would log to
it see none, and the trainer's own writer imports it after."""

import subprocess
import sys

import pytest
import torch

from megatron_neobert.kernels import compiled_on_first_call, left_out


def scaled_gelu(x, scale: float):
    return torch.nn.functional.gelu(x) * scale


def test_a_deferred_function_computes_what_the_compiled_one_does_and_compile_comes_back():
    import torch._dynamo

    compile_before = torch.compile
    with compiled_on_first_call():
        deferred = torch.compile(scaled_gelu, backend="eager")
        as_decorator = torch.compile(backend="eager")(scaled_gelu)
        module = torch.compile(torch.nn.Linear(2, 2), backend="eager")
    assert torch.compile is compile_before
    assert deferred.__wrapped__ is scaled_gelu and as_decorator.__wrapped__ is scaled_gelu
    assert isinstance(module, torch._dynamo.eval_frame.OptimizedModule)  # modules are compiled at once
    x = torch.randn(4, 8)
    assert torch.equal(deferred(x, 2.0), torch.compile(scaled_gelu, backend="eager")(x, 2.0))
    assert torch.equal(as_decorator(x, 0.5), scaled_gelu(x, 0.5))


@pytest.mark.integration  # a fresh interpreter
def test_megatron_cores_import_through_the_entry_points_imports_no_inductor_and_no_wandb():
    probe = ("import sys\n"
             "from megatron_neobert.kernels import import_megatron_core\n"
             "import_megatron_core()\n"
             "from megatron.core import timers\n"
             "from megatron.core.fusions import fused_bias_swiglu\n"
             "print(sorted(m for m in ('torch._dynamo', 'torch._inductor', 'wandb') if m in sys.modules),\n"
             "      fused_bias_swiglu.swiglu.__wrapped__.__module__, timers.wandb)\n"
             "import wandb\n"
             "print(callable(wandb.init))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["[] megatron.core.fusions.fused_bias_swiglu None", "True"]


def test_a_module_left_out_is_refused_inside_the_block_and_imports_after_it():
    with left_out("json.tool"):
        with pytest.raises(ImportError):
            import json.tool  # noqa: F401
    import json.tool  # noqa: F401,F811
    assert sys.modules["json.tool"].main
    with left_out("json.tool"):  # imported before: left as it is
        import json.tool  # noqa: F401,F811
