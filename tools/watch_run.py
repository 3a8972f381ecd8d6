"""`python tools/watch_run.py` in a checkout: the neobert-watch-run command (megatron_neobert/cli/watch_run.py)."""

import sys

from megatron_neobert.cli.watch_run import main

if __name__ == "__main__":
    sys.exit(main())
