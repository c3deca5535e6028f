#!/usr/bin/env python3
"""The offline Pathfinder generator (hgrn_fairseq/preprocessing/lra_pathfinder.py)."""
import sys

from hgrn_fairseq.preprocessing.lra_pathfinder import main

if __name__ == "__main__":
    sys.exit(main())
