#!/usr/bin/env python3
"""fairseq-preprocess with a fixed dictionary (hgrn_fairseq/preprocessing/fairseq_binarize.py)."""
import sys

from hgrn_fairseq.preprocessing.fairseq_binarize import main

if __name__ == "__main__":
    sys.exit(main())
