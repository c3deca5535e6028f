"""Entry points users run; the code they share lives in the package (hgrn_fairseq.cli, hgrn_fairseq.recipes)."""
