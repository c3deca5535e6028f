"""Evaluation tools that run on trained fairseq checkpoints (not imported at fairseq start-up).

* ``extrapolation``: test perplexity across evaluation lengths L, with a hard check that
  every test token was scored, and a ``stateful`` mode for recurrent models.
  CLI: ``python -m hgrn_fairseq.evaluation.extrapolation CHECKPOINT [DATA]``.
"""
