#!/usr/bin/env bash
# transformers' common model tests against the newest transformers release (or the one given), to see what a
# release changed before moving the `test` extra's pin (REVIEWED_TRANSFORMERS in setup.py and in
# tests/test_hf_transformers_common.py). The release goes into a throw-away folder put first on PYTHONPATH, so this
# environment keeps its pinned one. Skips nobody has reviewed are listed at the end; failures fail.
#   bash tests/check_transformers_release.sh            # the newest release
#   bash tests/check_transformers_release.sh 5.23.0     # a given one
set -euo pipefail
cd "$(dirname "$0")/.."
release="${1:-}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python -m pip install --quiet --no-warn-conflicts --target "$scratch" "transformers${release:+==$release}"
export PYTHONPATH="$scratch${PYTHONPATH:+:$PYTHONPATH}"
echo "transformers $(python -c 'import transformers; print(transformers.__version__)') from $scratch"
python -m pytest -q -p no:cacheprovider \
    tests/test_hf_transformers_common.py
