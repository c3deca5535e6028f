#!/usr/bin/env python3
"""Pack / restore an MQAR sweep between machines (hgrn_fairseq/cli/mqar_state.py)."""
import sys

from hgrn_fairseq.cli.mqar_state import main

if __name__ == "__main__":
    sys.exit(main())
