"""``mqar_cross_entropy``: cross-entropy and accuracy on the scored (non-padding) targets only.

(No ``from __future__ import annotations`` here: fairseq reads the dataclass field types.)

Made for the ``mqar`` task, whose targets are padding except at query positions; works for any
task with that convention. The loss is normalised per scored target (``sample_size`` = their
number), in base 2 in the logs like fairseq's ``cross_entropy``; ``accuracy`` (percent) is the
share of scored targets whose arg-max over the whole vocabulary is right.

Only the scored positions go through the output projection when the model is a fairseq
decoder with ``features_only`` / ``output_layer`` (``hgrn_lm`` is): MQAR scores N of seq_len
positions, so this skips most of the largest matrix product of the model.
"""

import math
from dataclasses import dataclass

import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II


@dataclass
class MqarCrossEntropyConfig(FairseqDataclass):
    sentence_avg: bool = II("optimization.sentence_avg")


@register_criterion("mqar_cross_entropy", dataclass=MqarCrossEntropyConfig)
class MqarCrossEntropyCriterion(FairseqCriterion):
    def __init__(self, task, sentence_avg=False):
        super().__init__(task)
        self.sentence_avg = sentence_avg

    def scored_log_probs(self, model, sample, mask):
        """Log-probabilities ``[M, V]`` (float32) at the ``M`` positions where ``mask`` is set."""
        decoder = getattr(model, "decoder", None)
        fast = hasattr(decoder, "output_layer") and getattr(decoder, "adaptive_softmax", None) is None
        if fast:
            features, extra = model(**sample["net_input"], features_only=True)
            logits = decoder.output_layer(features[mask])
            return model.get_normalized_probs((logits, extra), log_probs=True)
        net_output = model(**sample["net_input"])
        return model.get_normalized_probs(net_output, log_probs=True)[mask]

    def forward(self, model, sample, reduce=True):
        target = model.get_targets(sample, None)
        mask = target.ne(self.padding_idx)
        scored = target[mask]
        lprobs = self.scored_log_probs(model, sample, mask)
        loss = F.nll_loss(lprobs, scored, reduction="sum" if reduce else "none")
        n_correct = lprobs.argmax(dim=-1).eq(scored).sum()
        n_scored = int(scored.numel())
        sample_size = target.size(0) if self.sentence_avg else n_scored
        logging_output = {
            "loss": loss.data,
            "ntokens": sample.get("ntokens", n_scored),
            "nsentences": target.size(0),
            "sample_size": sample_size,
            "n_scored": n_scored,
            "n_correct": int(n_correct),
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(float(log.get(key, 0)) for log in logging_outputs)

        loss_sum, sample_size = total("loss"), total("sample_size")
        n_scored, n_correct = total("n_scored"), total("n_correct")
        # loss per scored target (or per sentence with --sentence-avg), in base 2
        metrics.log_scalar("loss", loss_sum / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", loss_sum / max(n_scored, 1) / math.log(2), n_scored, round=3)
        metrics.log_derived("ppl", lambda meters: round(2 ** meters["nll_loss"].avg, 3))
        metrics.log_scalar("_n_scored", n_scored)
        metrics.log_scalar("_n_correct", n_correct)
        metrics.log_derived(
            "accuracy",
            lambda meters: round(100.0 * meters["_n_correct"].sum / meters["_n_scored"].sum, 3)
            if meters["_n_scored"].sum > 0
            else float("nan"),
        )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True

