"""Named archs of ``hgrn_lm`` for MQAR (HGRN2 paper Fig. 3): 2 layers, no MLP, no positions.

(No ``from __future__ import annotations`` here: fairseq reads the dataclass field types.)

The width d comes from ``--decoder-embed-dim`` (default 128); the paper sweeps d in
{64, 128, 256, 512}. Dropout 0. ``hgrn_lm``'s build validates the options.

* ``hgrn1_mqar``: complex HGRU (HGRN1) with the layer-wise lower bounds.
* ``hgrn2_mqar``: HGRU2 with expand ratio ``min(d, 128)`` unless ``--expand-ratio`` is given
  (one head up to d = 128), no lower bound.

The mixer is HGRU2's LM variant (v linear, q SiLU), as the decoder builds every HGRU2; the LRA
variant (SiLU v, sigmoid q) recalled less in short CPU runs. Both models sit on a plateau before
they learn recall, so short budgets compare plateau lengths, not models: docs/mqar.md.
"""

from fairseq.models import register_model_architecture
from fairseq.utils import safe_getattr

from .hgrn_lm import _set_defaults, hgrn_lm_default

MQAR_DEFAULT_DIM = 128


def _mqar_common(args):
    _set_defaults(args, decoder_embed_dim=MQAR_DEFAULT_DIM, decoder_layers=2, glu_dim=0, dropout=0.0)


@register_model_architecture("hgrn_lm", "hgrn1_mqar")
def hgrn1_mqar(args):
    _mqar_common(args)
    _set_defaults(args, token_mixer="hgru", no_lower_bound=False)
    hgrn_lm_default(args)


@register_model_architecture("hgrn_lm", "hgrn2_mqar")
def hgrn2_mqar(args):
    _mqar_common(args)
    d = safe_getattr(args, "decoder_embed_dim")
    _set_defaults(args, token_mixer="hgru2", no_lower_bound=True, expand_ratio=min(d, 128))
    hgrn_lm_default(args)
