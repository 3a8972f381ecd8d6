"""`python tools/preprocess_data.py` in a checkout: the neobert-preprocess-data command (megatron_neobert/cli/preprocess_data.py)."""

import sys

from megatron_neobert.cli.preprocess_data import main

if __name__ == "__main__":
    sys.exit(main())
