"""``reestimate_running_stats`` (precise batch-norm statistics for a fixed model) against the pooled statistics
written out here in float64: two masked batch norms in a row with a linear map and a dropout between them, three
batches of different lengths and padding. The first norm's running statistics must be the mean and unbiased
variance over every valid position of the three batches (not a momentum average, not a mean of per-batch means:
the batches hold different numbers of valid positions); the second's those of its inputs, which pass through
the first norm in training mode (each batch normalised by its own statistics) and the linear map, dropout off."""
import pytest
import torch
from torch import nn

from hgrn_fairseq.modules.norms import MaskedBatchNorm, reestimate_running_stats

DIM = 3


class TwoNorms(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = MaskedBatchNorm(DIM)
        self.lin = nn.Linear(DIM, DIM).double()
        self.drop = nn.Dropout(0.5)
        self.norm2 = MaskedBatchNorm(DIM)

    def forward(self, x, pads):
        h = self.drop(self.lin(self.norm1(x, pads)))
        return self.norm2(h, padding_mask=pads)  # (the keyword form too)


def _batches():
    g = torch.Generator().manual_seed(3)
    out = []
    for b, t, npad, shift in ((2, 5, 1, 0.0), (3, 4, 5, 4.0), (1, 7, 0, -2.0)):
        x = torch.randn(b, t, DIM, generator=g, dtype=torch.float64) * (1 + shift ** 2) + shift
        pads = torch.zeros(b, t, dtype=torch.bool)
        pads.view(-1)[torch.randperm(b * t, generator=g)[:npad]] = True
        pads[:, 0] = False  # every row keeps a valid position
        x[pads] = 1e3  # garbage at the pads: counted, it would move every statistic
        out.append((x, pads))
    return out


def _pooled(rows):
    """Mean and unbiased variance per channel of the rows ``[N, DIM]`` (float64), written out."""
    n = rows.shape[0]
    mean = rows.sum(0) / n
    var = ((rows - mean) ** 2).sum(0) / (n - 1)
    return mean, var


def _reference(model, batches):
    """Both norms' pooled input statistics, the forward written out by hand."""
    w1, b1 = model.norm1.weight.detach().double(), model.norm1.bias.detach().double()
    ins1, ins2 = [], []
    for x, pads in batches:
        valid = x[~pads]
        ins1.append(valid)
        mu = valid.mean(0)
        var = ((valid - mu) ** 2).mean(0)  # training mode: the batch's biased variance
        y = (x - mu) / torch.sqrt(var + model.norm1.eps) * w1 + b1
        y = y * (~pads).unsqueeze(-1)
        h = y @ model.lin.weight.detach().T + model.lin.bias.detach()
        ins2.append(h[~pads])
    return _pooled(torch.cat(ins1)), _pooled(torch.cat(ins2))


def test_running_stats_are_the_pooled_statistics_of_the_valid_positions():
    torch.manual_seed(0)
    model = TwoNorms()
    with torch.no_grad():  # trained-looking affine parameters and stale running statistics
        for m in (model.norm1, model.norm2):
            m.weight.uniform_(0.5, 2.0)
            m.bias.uniform_(-1.0, 1.0)
            m.running_mean.fill_(7.0)
            m.running_var.fill_(0.01)
    batches = _batches()
    (m1, v1), (m2, v2) = _reference(model, batches)
    n = reestimate_running_stats(model, batches, lambda mod, b: mod(*b))
    assert n == 3
    torch.testing.assert_close(model.norm1.running_mean.double(), m1, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model.norm1.running_var.double(), v1, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model.norm2.running_mean.double(), m2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model.norm2.running_var.double(), v2, rtol=1e-6, atol=1e-6)
    assert not model.training and not model.norm1.training and not model.drop.training


def test_no_batch_norm_or_no_batches_is_an_error():
    with pytest.raises(ValueError, match="no MaskedBatchNorm"):
        reestimate_running_stats(nn.Sequential(nn.LayerNorm(DIM)), [torch.zeros(1, DIM)], lambda m, b: m(b))
    with pytest.raises(ValueError, match="no batches"):
        reestimate_running_stats(TwoNorms(), [], lambda m, b: m(*b))
