"""Runs megatron_neobert/cli/preprocess_data.py (the neobert-preprocess-data command) from a checkout."""

import sys

from megatron_neobert.cli.preprocess_data import main

if __name__ == "__main__":
    sys.exit(main())
