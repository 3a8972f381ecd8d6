"""`python tools/run_mteb.py` in a checkout: the neobert-run-mteb command (megatron_neobert/cli/run_mteb.py)."""

from megatron_neobert.cli.run_mteb import main

if __name__ == "__main__":
    main()
