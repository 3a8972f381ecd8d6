"""Runs megatron_neobert/cli/watch_run.py (the neobert-watch-run command) from a checkout."""

import sys

from megatron_neobert.cli.watch_run import main

if __name__ == "__main__":
    sys.exit(main())
