#!/usr/bin/env python3
"""The offline sentencepiece BPE tokenizer (hgrn_fairseq/preprocessing/sentencepiece_bpe.py)."""
import sys

from hgrn_fairseq.preprocessing.sentencepiece_bpe import main

if __name__ == "__main__":
    sys.exit(main())
