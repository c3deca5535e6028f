#!/usr/bin/env python3
"""How far ListOps can be answered without evaluating the tree: the majority class and a logistic
regression on bags of token n-grams (scikit-learn), trained on the train TSV, scored on the test TSV.

    python -m bench.listops_ngram_baseline GENERATED_DIR [--ngrams 1,2]

GENERATED_DIR holds ``listops-1000/basic_{train,test}.tsv`` (``data_prep/lra_listops.py`` or LRA's
release). The tokens are those the models see (``prepare_lra.listops_tokens``).
A model whose accuracy sits at these numbers has learned token statistics, not the operators: the
reference level for reading a ListOps curve (docs/lra.md, Findings).
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import sys



def load(folder: str, split: str):
    path = os.path.join(folder, "listops-1000", f"basic_{split}.tsv")
    if not os.path.isfile(path):
        sys.exit(f"listops_ngram_baseline.py: {path} is missing: pass the folder data_prep/lra_listops.py "
                 "wrote (--dest) or LRA's lra_release/lra_release")
    from data_prep.prepare_lra import listops_tokens  # the tokens the models are trained on (imports fairseq: after the check)

    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))[1:]
    texts = [" ".join(listops_tokens(r[0])) for r in rows]
    return texts, [int(r[1]) for r in rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--ngrams", default="1,2", help="largest n of each bag to fit, comma-separated (default 1,2)")
    args = p.parse_args(argv)
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    x_train, y_train = load(args.folder, "train")
    x_test, y_test = load(args.folder, "test")
    lengths = sorted(len(t.split()) for t in x_train)
    print(f"{args.folder}: train {len(x_train)}, test {len(x_test)}, tokens per example "
          f"{lengths[0]}-{lengths[-1]} (median {lengths[len(lengths) // 2]})")
    majority = max(collections.Counter(y_test).values()) / len(y_test)
    print(f"majority class: {100 * majority:.2f}%")
    for n in (int(v) for v in args.ngrams.split(",")):
        bag = CountVectorizer(token_pattern=r"\S+", ngram_range=(1, n), lowercase=False)
        a, b = bag.fit_transform(x_train), bag.transform(x_test)
        clf = LogisticRegression(max_iter=3000).fit(a, y_train)
        print(f"logistic regression on 1..{n}-grams ({a.shape[1]} features): {100 * clf.score(b, y_test):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
