#!/usr/bin/env python3
"""fairseq-train with --bf16 meaning bfloat16 on the device it runs on (hgrn_fairseq/cli/fairseq_train.py)."""
import sys

from hgrn_fairseq.cli.fairseq_train import main

if __name__ == "__main__":
    sys.exit(main())
