"""Runs megatron_neobert/cli/finetune_contrastive.py (the neobert-finetune-contrastive command) from a checkout."""

from megatron_neobert.cli.finetune_contrastive import main

if __name__ == "__main__":
    main()
