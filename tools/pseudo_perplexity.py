"""Runs megatron_neobert/cli/pseudo_perplexity.py (the neobert-pseudo-perplexity command) from a checkout."""

from megatron_neobert.cli.pseudo_perplexity import main

if __name__ == "__main__":
    main()
