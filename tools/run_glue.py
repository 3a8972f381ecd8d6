"""Runs megatron_neobert/cli/run_glue.py (the neobert-run-glue command) from a checkout."""

from megatron_neobert.cli.run_glue import main

if __name__ == "__main__":
    main()
