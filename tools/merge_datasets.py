"""Runs megatron_neobert/cli/merge_datasets.py (the neobert-merge-datasets command) from a checkout."""

import sys

from megatron_neobert.cli.merge_datasets import main

if __name__ == "__main__":
    sys.exit(main())
