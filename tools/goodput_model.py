"""Runs megatron_neobert/cli/goodput_model.py (the neobert-goodput-model command) from a checkout."""

import sys

from megatron_neobert.cli.goodput_model import main

if __name__ == "__main__":
    sys.exit(main())
