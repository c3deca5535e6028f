#!/usr/bin/env python3
"""The LRA recipes' command line (hgrn_fairseq/recipes/lra.py): fairseq-train flags, a recipe as JSON, the hydra configs."""
import sys

from hgrn_fairseq.recipes.lra import main

if __name__ == "__main__":
    sys.exit(main())
