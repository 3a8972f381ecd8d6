"""Runs megatron_neobert/cli/convert_checkpoint.py (the neobert-convert-checkpoint command) from a checkout."""

import sys

from megatron_neobert.cli.convert_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
