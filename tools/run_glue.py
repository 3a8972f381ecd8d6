"""`python tools/run_glue.py` in a checkout: the neobert-run-glue command (megatron_neobert/cli/run_glue.py)."""

from megatron_neobert.cli.run_glue import main

if __name__ == "__main__":
    main()
