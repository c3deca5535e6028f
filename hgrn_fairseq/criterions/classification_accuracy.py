"""``classification_accuracy``: cross-entropy over one label per example, with accuracy and counts.

(No ``from __future__ import annotations`` here: fairseq reads the dataclass field types.)

For models whose ``forward(**net_input)`` returns logits ``[B, classes]`` and batches whose ``target``
is ``[B]`` class indices (the LRA tasks). The loss is the mean cross-entropy per example, logged in
base 2 as fairseq's criteria do; ``accuracy`` is in percent; ``examples`` is the number of examples
scored (a sum over the whole validation pass: it must equal the split's size). A label outside
``0 .. classes - 1`` is an error naming the fix. Best checkpoint by accuracy:
``--best-checkpoint-metric accuracy --maximize-best-checkpoint-metric``.
"""

import math
from dataclasses import dataclass

import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics


@dataclass
class ClassificationAccuracyConfig(FairseqDataclass):
    pass


@register_criterion("classification_accuracy", dataclass=ClassificationAccuracyConfig)
class ClassificationAccuracyCriterion(FairseqCriterion):
    def forward(self, model, sample, reduce=True):
        logits = model(**sample["net_input"])
        target = sample["target"].view(-1)
        classes = logits.size(-1)
        # Checked where it costs nothing: on the CPU. On a GPU the comparison would stall every step
        # on the host; the LRA tasks check every split's labels against num_classes when they load it.
        if target.device.type == "cpu" and target.numel() and (int(target.min()) < 0 or int(target.max()) >= classes):
            raise ValueError(f"classification_accuracy: label {int(target.max()) if int(target.max()) >= classes else int(target.min())} "
                             f"outside 0..{classes - 1} (the model has {classes} classes): check the data's num_classes "
                             f"and rerun data_prep/prepare_lra.py")
        loss = F.cross_entropy(logits.float(), target, reduction="sum" if reduce else "none")
        n_correct = logits.argmax(dim=-1).eq(target).sum()
        n = target.numel()
        logging_output = {
            "loss": loss.data,
            "ntokens": sample.get("ntokens", n),
            "nsentences": n,
            "sample_size": n,
            "n_correct": n_correct.data,
        }
        return loss, n, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(float(log.get(key, 0)) for log in logging_outputs)

        loss_sum, n, n_correct = total("loss"), total("nsentences"), total("n_correct")
        metrics.log_scalar("loss", loss_sum / max(n, 1) / math.log(2), n, round=4)
        metrics.log_scalar("_n_examples", n)
        metrics.log_scalar("_n_correct", n_correct)
        metrics.log_derived("examples", lambda meters: int(meters["_n_examples"].sum))
        metrics.log_derived(
            "accuracy",
            lambda meters: round(100.0 * meters["_n_correct"].sum / meters["_n_examples"].sum, 3)
            if meters["_n_examples"].sum > 0 else float("nan"),
        )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
