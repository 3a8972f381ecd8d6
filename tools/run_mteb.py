"""Runs megatron_neobert/cli/run_mteb.py (the neobert-run-mteb command) from a checkout."""

from megatron_neobert.cli.run_mteb import main

if __name__ == "__main__":
    main()
