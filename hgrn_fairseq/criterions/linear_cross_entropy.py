"""``linear_cross_entropy``: fairseq's ``cross_entropy`` with the output projection fused into the loss.

(No ``from __future__ import annotations`` here: fairseq reads the dataclass field types.)

Same loss, ``sample_size``, logging outputs and logged metrics (base 2, ppl) as
``--criterion cross_entropy`` (it subclasses it), but the model runs with ``features_only=True`` and
``hgrn_fairseq.kernels.linear_cross_entropy`` computes the loss from the features and the decoder's
output weight in chunks, without the ``[tokens, vocab]`` fp32 logits, log-probabilities and their
gradients, which at the WikiText-103 vocabulary are a large part of a training step's time and memory.

Works for decoders whose output layer is one bias-free matrix: ``hgrn_lm`` (tied: the embedding;
untied: ``output_projection``) and fairseq's ``transformer_lm`` without adaptive softmax (tied or not).
Other decoders get an error that says to use ``--criterion cross_entropy``.
"""

import functools
import inspect
from dataclasses import dataclass

import torch.nn as nn
from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig

from ..kernels import linear_cross_entropy

USE_CROSS_ENTROPY = "use --criterion cross_entropy for this model"


@dataclass
class LinearCrossEntropyCriterionConfig(CrossEntropyCriterionConfig):
    pass


@functools.lru_cache(maxsize=None)
def _takes_features_only(decoder_cls) -> bool:
    """Whether the decoder class's forward has a features_only argument (per class: the check runs on
    every training step)."""
    return "features_only" in inspect.signature(decoder_cls.forward).parameters


def output_weight(model):
    """The ``[V, d]`` weight of the decoder's output projection (the logits are features @ weight.T).

    Raises ``ValueError`` for decoders the fused loss cannot reproduce exactly."""
    decoder = getattr(model, "decoder", None)
    name = type(decoder).__name__ if decoder is not None else type(model).__name__
    if decoder is None:
        raise ValueError(f"linear_cross_entropy: {name} has no .decoder; {USE_CROSS_ENTROPY}")
    if getattr(decoder, "adaptive_softmax", None) is not None:
        raise ValueError(f"linear_cross_entropy: {name} uses an adaptive softmax; {USE_CROSS_ENTROPY}")
    if not _takes_features_only(type(decoder)):
        raise ValueError(
            f"linear_cross_entropy: {name}.forward takes no features_only argument; {USE_CROSS_ENTROPY}"
        )
    if not hasattr(decoder, "output_projection"):
        raise ValueError(f"linear_cross_entropy: {name} has no output_projection; {USE_CROSS_ENTROPY}")
    projection = decoder.output_projection
    if projection is None:  # hgrn_lm with tied embeddings: output_layer is F.linear(x, embed_tokens.weight)
        embed = getattr(decoder, "embed_tokens", None)
        if not isinstance(embed, nn.Embedding):
            raise ValueError(
                f"linear_cross_entropy: {name}.output_projection is None and there is no embed_tokens "
                f"embedding to tie to; {USE_CROSS_ENTROPY}"
            )
        return embed.weight
    if type(projection) is not nn.Linear:
        raise ValueError(
            f"linear_cross_entropy: {name}.output_projection is a {type(projection).__name__}, not an "
            f"nn.Linear; {USE_CROSS_ENTROPY}"
        )
    if projection.bias is not None:
        raise ValueError(f"linear_cross_entropy: {name}.output_projection has a bias; {USE_CROSS_ENTROPY}")
    return projection.weight


@register_criterion("linear_cross_entropy", dataclass=LinearCrossEntropyCriterionConfig)
class LinearCrossEntropyCriterion(CrossEntropyCriterion):
    def forward(self, model, sample, reduce=True):
        """``(loss, sample_size, logging_output)`` as fairseq's ``cross_entropy`` returns them."""
        weight = output_weight(model)
        features, _ = model(**sample["net_input"], features_only=True)
        target = model.get_targets(sample, None)
        loss = linear_cross_entropy(
            features.reshape(-1, features.size(-1)),
            weight,
            target.reshape(-1),
            ignore_index=self.padding_idx,
            reduction="sum" if reduce else "none",
        )
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output
