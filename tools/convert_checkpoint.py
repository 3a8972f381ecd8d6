"""`python tools/convert_checkpoint.py` in a checkout: the neobert-convert-checkpoint command (megatron_neobert/cli/convert_checkpoint.py)."""

import sys

from megatron_neobert.cli.convert_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
