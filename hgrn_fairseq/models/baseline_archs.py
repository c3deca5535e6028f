"""Named archs of ``hgrn_lm`` with the baselines' token mixers (docs/baselines.md): the WikiText-103
decoder of ``hgrn_lm_base`` (6 layers, d 512, bilinear GLU 1024, tied embeddings) with the mixer swapped.

(No ``from __future__ import annotations`` here: fairseq reads the dataclass field types.)

* ``lru_lm_base``: LRU with N = 897 complex state channels, ring r in [0, 1], phase in [0, 2 pi): 46,242,578
  parameters with the 50,264-entry GPT-2 dictionary, the paper's 46.24M (its LRU row; the state size was
  not published, 897 is the N whose count rounds to it: 896 gives 46.23M, 898 46.25M). No lower bound
  (the LRU has no forget gate).
* ``lru_mml_lm_base``: the same with B ternary (LRU-MML; BitLinear adds an RMSNorm weight).
* ``mlgru_lm_base``: MLGRU (four d x d projections with biases), with HGRN's layer-wise lower bound on the
  forget gate, as the released matmul-free code has it (default on; ``--no-lower-bound`` for the plain
  MLGRU of the paper's equations).
* ``mlgru_mml_lm_base``: the same with W_f and W_c ternary (GRU-MML).
"""
from fairseq.models import register_model_architecture

from .hgrn_lm import _set_defaults, hgrn_lm_default

LRU_STATE_DIM = 897


@register_model_architecture("hgrn_lm", "lru_lm_base")
def lru_lm_base(args):
    _set_defaults(args, token_mixer="lru", state_dim=LRU_STATE_DIM, no_lower_bound=True)
    hgrn_lm_default(args)


@register_model_architecture("hgrn_lm", "lru_mml_lm_base")
def lru_mml_lm_base(args):
    _set_defaults(args, ternary=True)
    lru_lm_base(args)


@register_model_architecture("hgrn_lm", "mlgru_lm_base")
def mlgru_lm_base(args):
    _set_defaults(args, token_mixer="mlgru")
    hgrn_lm_default(args)


@register_model_architecture("hgrn_lm", "mlgru_mml_lm_base")
def mlgru_mml_lm_base(args):
    _set_defaults(args, ternary=True)
    mlgru_lm_base(args)


@register_model_architecture("hgrn_lm", "lru_lm_tiny")
def lru_lm_tiny(args):
    """A tiny LRU LM for tests."""
    _set_defaults(args, decoder_embed_dim=64, decoder_layers=2, glu_dim=128, state_dim=48)
    lru_lm_base(args)


@register_model_architecture("hgrn_lm", "mlgru_lm_tiny")
def mlgru_lm_tiny(args):
    """A tiny MLGRU LM for tests."""
    _set_defaults(args, decoder_embed_dim=64, decoder_layers=2, glu_dim=128)
    mlgru_lm_base(args)
