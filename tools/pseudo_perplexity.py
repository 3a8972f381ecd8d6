"""`python tools/pseudo_perplexity.py` in a checkout: the neobert-pseudo-perplexity command (megatron_neobert/cli/pseudo_perplexity.py)."""

from megatron_neobert.cli.pseudo_perplexity import main

if __name__ == "__main__":
    main()
