"""Runs megatron_neobert/cli/stage2_plan.py (the neobert-stage2-plan command) from a checkout."""

import sys

from megatron_neobert.cli.stage2_plan import main

if __name__ == "__main__":
    sys.exit(main())
