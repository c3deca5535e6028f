#!/usr/bin/env python3
"""The LRA results table (hgrn_fairseq/recipes/lra_results.py)."""
import sys

from hgrn_fairseq.recipes.lra_results import main

if __name__ == "__main__":
    sys.exit(main())
