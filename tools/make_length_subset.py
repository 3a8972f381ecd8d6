"""Runs megatron_neobert/cli/make_length_subset.py (the neobert-make-length-subset command) from a checkout."""

import sys

from megatron_neobert.cli.make_length_subset import main

if __name__ == "__main__":
    sys.exit(main())
