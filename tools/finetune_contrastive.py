"""`python tools/finetune_contrastive.py` in a checkout: the neobert-finetune-contrastive command (megatron_neobert/cli/finetune_contrastive.py)."""

from megatron_neobert.cli.finetune_contrastive import main

if __name__ == "__main__":
    main()
