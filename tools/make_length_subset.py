"""`python tools/make_length_subset.py` in a checkout: the neobert-make-length-subset command (megatron_neobert/cli/make_length_subset.py)."""

import sys

from megatron_neobert.cli.make_length_subset import main

if __name__ == "__main__":
    sys.exit(main())
