#!/usr/bin/env python3
"""fairseq-train with --bf16 meaning bfloat16 on the device it runs on (hgrn_fairseq/cli/fairseq_train.py)."""
import sys

# fairseq_cli.train before anything that imports fairseq (the package does): it sets up fairseq's log format
from fairseq_cli import train  # noqa: F401

from hgrn_fairseq.cli.fairseq_train import main

if __name__ == "__main__":
    sys.exit(main())
