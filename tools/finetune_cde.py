"""Runs megatron_neobert/cli/finetune_cde.py (the neobert-finetune-cde command) from a checkout."""

from megatron_neobert.cli.finetune_cde import main

if __name__ == "__main__":
    main()
