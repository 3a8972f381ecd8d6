"""`python tools/finetune_cde.py` in a checkout: the neobert-finetune-cde command (megatron_neobert/cli/finetune_cde.py)."""

from megatron_neobert.cli.finetune_cde import main

if __name__ == "__main__":
    main()
