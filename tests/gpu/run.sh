#!/usr/bin/env bash
# The GPU test suite on one GPU, from the repository root; results in $OUT (default gpu_results/), nothing
# written anywhere else in the tree:
#
#   REQUIRE_GPU_KERNELS=te,fp8 OUT=/results/te bash tests/gpu/run.sh
#
# A test whose kernel path is absent skips; REQUIRE_GPU_KERNELS (any of gpu, te, fp8, flash, dali) turns those
# skips into failures (tests/gpu/conftest.py). $OUT holds 4 files, each cut to its last 16 MiB:
#   summary.txt      the start and the releases run (torch, megatron-core, Transformer Engine,
#                    nvidia-resiliency-ext), a line per test as it finishes (outcome, seconds, why), then the exit status; a SIGTERM
#                    (`timeout`) adds the test it stopped, and the tests after it do not run
#   environment.txt  the releases, the GPU, torch, megatron-core and the kernel paths found
#   gpu-tests.log    pytest's output;  gpu-tests.xml  its JUnit report
# The tests run most informative first (conftest.py ORDER). $PYTHON (default python3) runs them.
set -uo pipefail
OUT=${OUT:-gpu_results}
PY=${PYTHON:-python3}
MAX_BYTES=$((16 * 1024 * 1024))
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1 GPU_TESTS_SUMMARY=$OUT/summary.txt
started=$(date +%s)
# A SIGTERM (`timeout`) reaches every process of the group: the trap lets this script write the end of the summary.
stopped=0
trap 'stopped=1' TERM
# The releases the suite runs on, from the packages' metadata (known even when an import fails): on summary.txt's
# first line and first in environment.txt.
versions=$("$PY" -c "import importlib.metadata as m
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return 'absent'
print('versions: ' + ' | '.join(f'{n} {v(n)}' for n in ('torch', 'megatron-core', 'transformer-engine',
                                                          'nvidia-resiliency-ext')))" 2>&1 | tail -1)
{
    echo "$versions"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$PY" -c "import torch, megatron.core, megatron_neobert.kernels as k; \
print('torch', torch.__version__, 'CUDA', torch.version.cuda, '| megatron-core', megatron.core.__version__); \
print(k.format_report(k.kernel_report('auto', 'torch')))"
} > "$OUT/environment.txt" 2>&1
echo "REQUIRE_GPU_KERNELS=${REQUIRE_GPU_KERNELS:-} started $(date -u +%FT%TZ) | $versions" > "$OUT/summary.txt"

# pytest in the background so that `wait` returns at a SIGTERM: pytest gets the same signal and stops as on
# Ctrl-C (conftest.py); it has 10 s to write its reports.
status=124
if [ "$stopped" = 0 ]; then
    "$PY" -m pytest -p no:cacheprovider -v -ra tests/gpu --junitxml="$OUT/gpu-tests.xml" > "$OUT/gpu-tests.log" 2>&1 &
    pytest_pid=$!
    wait "$pytest_pid"
    status=$?
    if [ "$stopped" = 1 ]; then
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pytest_pid" 2>/dev/null || break; sleep 1; done
        kill -KILL "$pytest_pid" 2>/dev/null
        wait "$pytest_pid" 2>/dev/null
        status=124
    fi
fi
echo "exit status $status after $(( $(date +%s) - started )) s$([ "$stopped" = 1 ] && echo ' (stopped by SIGTERM)')" \
    >> "$OUT/summary.txt"
for f in summary.txt environment.txt gpu-tests.log gpu-tests.xml; do
    f=$OUT/$f
    [ ! -f "$f" ] || [ "$(stat -c %s "$f")" -le "$MAX_BYTES" ] ||
        { tail -c "$MAX_BYTES" "$f" > "$f.part" && mv "$f.part" "$f"; }
done
tail -n 25 "$OUT/gpu-tests.log"
cat "$OUT/summary.txt"
exit "$status"
