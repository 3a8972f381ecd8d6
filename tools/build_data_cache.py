"""Runs megatron_neobert/cli/build_data_cache.py (the neobert-build-data-cache command) from a checkout."""

import sys

from megatron_neobert.cli.build_data_cache import main

if __name__ == "__main__":
    sys.exit(main())
