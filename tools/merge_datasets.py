"""`python tools/merge_datasets.py` in a checkout: the neobert-merge-datasets command (megatron_neobert/cli/merge_datasets.py)."""

import sys

from megatron_neobert.cli.merge_datasets import main

if __name__ == "__main__":
    sys.exit(main())
