"""``classification_accuracy``: loss, accuracy and example counts against hand computations; labels
outside the class range are refused."""
import math

import pytest
import torch
from fairseq.logging import metrics

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from hgrn_fairseq.criterions.classification_accuracy import ClassificationAccuracyCriterion


class FixedLogits(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, **net_input):
        return self.logits[net_input["rows"]]


def criterion():
    return ClassificationAccuracyCriterion(task=None)


def test_loss_accuracy_and_counts_by_hand():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.1, 0.3, 0.2], [0.0, 0.0, 5.0], [1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    target = torch.tensor([0, 2, 2, 0, 0])
    model = FixedLogits(logits)
    crit = criterion()
    batches = [torch.tensor([0, 1, 2]), torch.tensor([3, 4])]
    logs = []
    for rows in batches:
        loss, size, log = crit(model, {"net_input": {"rows": rows}, "target": target[rows]})
        assert size == len(rows)
        logs.append(log)
    # by hand: -log softmax at the target, summed; argmax rows 0, 1, 2, 2, 0 -> correct 0, 2, 4 (rows 0, 2, 4)
    nll = 0.0
    for row, t in zip(logits.tolist(), target.tolist()):
        nll += -(row[t] - math.log(sum(math.exp(v) for v in row)))
    assert float(logs[0]["loss"] + logs[1]["loss"]) == pytest.approx(nll, rel=1e-6)
    with metrics.aggregate(new_root=True) as agg:
        for log in logs:  # one reduce per batch, as fairseq's validation does
            ClassificationAccuracyCriterion.reduce_metrics([log])
        values = agg.get_smoothed_values()
    assert values["examples"] == 5
    assert values["accuracy"] == pytest.approx(60.0)
    assert values["loss"] == pytest.approx(nll / 5 / math.log(2), abs=1e-4)


def test_label_outside_the_classes_is_an_error():
    model = FixedLogits(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"label 3 outside 0..2 \(the model has 3 classes\)"):
        criterion()(model, {"net_input": {"rows": torch.tensor([0, 1])}, "target": torch.tensor([0, 3])})
    with pytest.raises(ValueError, match=r"label -1 outside 0..2"):
        criterion()(model, {"net_input": {"rows": torch.tensor([0, 1])}, "target": torch.tensor([-1, 0])})
