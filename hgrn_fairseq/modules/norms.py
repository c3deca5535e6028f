"""Norms of the residual blocks: LayerNorm, and batch norms that ignore padded positions.

``torch.nn.BatchNorm1d`` over a padded batch counts the padding in its mean and variance (the
official HGRN LRA code does this, so its statistics depend on how long the other sequences in the
batch were). ``MaskedBatchNorm`` computes the statistics over the valid positions only; with
``sync=True`` the sums are all-reduced over the distributed group (autograd-aware), which is
SyncBatchNorm with the same rule.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import nn

from ..kernels.block_ops import layer_norm

Tensor = torch.Tensor
NORMS = ("layer", "batch", "syncbatch")


def syncs_across_processes() -> bool:
    """Whether a ``sync=True`` batch norm all-reduces its sums now: a distributed group of more than one process."""
    return (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1)


class MaskedBatchNorm(nn.Module):
    """Batch norm over the channels of ``[B, T, C]`` (or ``[N, C]``), statistics from the positions
    where ``padding_mask`` (``[B, T]`` bool, True = padding) is False. Padded outputs are zero.

    Parameters and buffers are named as in ``nn.BatchNorm1d`` (weight, bias, running_mean,
    running_var, num_batches_tracked); running variance is the unbiased estimate, as torch's.
    Statistics are computed in float32 (float64 for float64 inputs).

    Nothing here reads a device value on the host (a training step on the GPU never waits in a norm):
    fewer than 2 positions in ``x`` is an error (known from the shape), but with a mask the number of
    *valid* positions stays on the device, so a batch with fewer than 2 valid positions is not refused:
    it normalises with variance 0 and its running-variance update uses ``n / max(n - 1, 1)``. (The LRA
    collaters refuse empty examples on the host, so a batch there always has one valid position per row.)
    """

    def __init__(self, dim: int, eps: float = 1e-5, momentum: float = 0.1, sync: bool = False):
        super().__init__()
        if dim < 1:
            raise ValueError(f"dim={dim} must be >= 1")
        self.dim, self.eps, self.momentum, self.sync = dim, eps, momentum, sync
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def _sums(self, x: Tensor, valid: Optional[Tensor]):
        xs = x.to(torch.promote_types(x.dtype, torch.float32)).reshape(-1, self.dim)
        if valid is not None:
            w = valid.reshape(-1, 1).to(xs.dtype)
            count = w.sum()
            s1, s2 = (xs * w).sum(0), (xs * xs * w).sum(0)
        else:
            count = xs.new_full((), float(xs.shape[0]))  # a fill on the device, not a host copy
            s1, s2 = xs.sum(0), (xs * xs).sum(0)
        if self.sync and syncs_across_processes():
            from torch.distributed.nn.functional import all_reduce

            packed = all_reduce(torch.cat([s1, s2, count.reshape(1)]))
            s1, s2, count = packed[: self.dim], packed[self.dim: 2 * self.dim], packed[-1]
        return s1, s2, count

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None, zero_padding: bool = True) -> Tensor:
        """``padding_mask`` keeps padded positions out of the statistics; their outputs are 0, or with
        ``zero_padding=False`` normalised like the others (for mixers that scan through the pads)."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"MaskedBatchNorm expects {self.dim} channels, got {tuple(x.shape)}")
        valid = None
        if padding_mask is not None:
            if padding_mask.shape != x.shape[:-1]:
                raise ValueError(f"padding_mask has shape {tuple(padding_mask.shape)}, expected {tuple(x.shape[:-1])}")
            valid = ~padding_mask
        if self.training:
            if x.numel() < 2 * self.dim:
                raise ValueError(f"MaskedBatchNorm in training needs at least 2 positions in the batch, got "
                                 f"{tuple(x.shape)}: use a larger batch, or norm='layer'")
            s1, s2, count = self._sums(x, valid)
            count = count.clamp_min(1.0)
            mean = s1 / count
            var = (s2 / count - mean * mean).clamp_min(0.0)
            with torch.no_grad():
                self.num_batches_tracked += 1
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
                unbiased = var.detach() * count / (count - 1).clamp_min(1.0)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        ct = torch.promote_types(x.dtype, torch.float32)
        y = (x.to(ct) - mean.to(ct)) * torch.rsqrt(var.to(ct) + self.eps) * self.weight.to(ct) + self.bias.to(ct)
        if valid is not None and zero_padding:
            y = y * valid.unsqueeze(-1)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, momentum={self.momentum}, sync={self.sync}"


def build_norm(kind: str, dim: int) -> nn.Module:
    """``layer``: ``nn.LayerNorm``; ``batch`` / ``syncbatch``: ``MaskedBatchNorm`` (synced over the
    distributed group for ``syncbatch``)."""
    if kind == "layer":
        return nn.LayerNorm(dim)
    if kind in ("batch", "syncbatch"):
        return MaskedBatchNorm(dim, sync=kind == "syncbatch")
    raise ValueError(f"norm={kind!r} is not one of {NORMS}")


def apply_norm(norm: nn.Module, x: Tensor, padding_mask: Optional[Tensor] = None,
               backend: Optional[str] = None, zero_padding: bool = True) -> Tensor:
    """Call a norm made by ``build_norm`` (LayerNorm needs no mask: it is per position).

    ``backend`` (``auto``/``triton``/``reference``): a LayerNorm runs through
    ``kernels.block_ops.layer_norm`` (on the Triton path its output is in the autocast dtype, for a
    matrix product to read); None: the module itself (fp32 output under autocast). ``zero_padding``:
    see ``MaskedBatchNorm.forward``."""
    if isinstance(norm, MaskedBatchNorm):
        return norm(x, padding_mask, zero_padding)
    if backend is not None and type(norm) is nn.LayerNorm and norm.elementwise_affine:
        return layer_norm(x, norm.weight, norm.bias, norm.eps, backend=backend)
    return norm(x)


def reestimate_running_stats(model: nn.Module, batches: Iterable, forward: Callable[[nn.Module, object], object]) -> int:
    """Set the running mean and variance of every ``MaskedBatchNorm`` in ``model`` to the pooled statistics
    of its inputs' valid positions over ``batches`` (``forward(model, batch)`` runs one), the weights fixed.

    The pooled mean and the unbiased pooled variance are exact over all the valid positions the batches
    gave each norm (float64 sums, not a running average), with the batch norms in training mode as they
    see their inputs ("precise BN": each norm's output in these passes uses the batch's statistics, as in
    training); every other module stays in eval mode (no dropout), no gradients. The model is left in eval
    mode. Returns the number of batches. Why: a norm's running average (momentum 0.1) lags the weights
    while they move, so a checkpoint scored in eval mode mid-run reads stale statistics (docs/lra.md)."""
    n, stats = pooled_norm_statistics(model, batches, forward)
    set_running_stats(model, stats[n])
    return n


def pooled_norm_statistics(model: nn.Module, batches: Iterable, forward: Callable[[nn.Module, object], object],
                           at: Optional[Iterable[int]] = None):
    """What ``reestimate_running_stats`` computes, without setting it, after the first k batches for each k in
    ``at`` (default: all of them): one pass gives nested re-estimates (k = 50 and 200 of the same draw).
    -> (number of batches, {k: {name of the norm in ``model``: (mean, unbiased variance), float64}}); the
    model is left in eval mode, its running statistics whatever the passes left (set them with
    ``set_running_stats``). An error when a k exceeds the number of batches."""
    norms = [(name, m) for name, m in model.named_modules() if isinstance(m, MaskedBatchNorm)]
    if not norms:
        raise ValueError("reestimate_running_stats: the model has no MaskedBatchNorm "
                         "(norm='layer' keeps no running statistics)")
    want = None if at is None else sorted({int(k) for k in at})
    if want is not None and (not want or want[0] < 1):
        raise ValueError(f"pooled_norm_statistics: at={list(at)} must hold batch counts >= 1")
    sums = {id(m): [0.0, 0.0, 0.0] for _, m in norms}

    def pre_hook(module, args, kwargs):
        x = args[0] if args else kwargs["x"]
        mask = args[1] if len(args) > 1 else kwargs.get("padding_mask")
        xs = x.detach().to(torch.float64).reshape(-1, module.dim)
        if mask is not None:
            xs = xs[~mask.reshape(-1)]
        acc = sums[id(module)]
        acc[0] = acc[0] + xs.shape[0]
        acc[1] = acc[1] + xs.sum(0)
        acc[2] = acc[2] + (xs * xs).sum(0)

    def pooled() -> dict:
        out = {}
        for name, m in norms:
            count, s1, s2 = sums[id(m)]
            if count < 2:
                raise ValueError(f"reestimate_running_stats: a norm saw {int(count)} valid positions; "
                                 "pass more batches")
            mean = s1 / count
            out[name] = (mean, (s2 / count - mean * mean).clamp_min(0.0) * count / (count - 1))
        return out

    model.eval()
    handles = [m.register_forward_pre_hook(pre_hook, with_kwargs=True) for _, m in norms]
    n, stats = 0, {}
    try:
        for _, m in norms:
            m.train()
        with torch.no_grad():
            for batch in batches:
                forward(model, batch)
                n += 1
                if want is not None and n in want:
                    stats[n] = pooled()
    finally:
        for h in handles:
            h.remove()
        model.eval()
    if n == 0:
        raise ValueError("reestimate_running_stats: no batches; pass at least one")
    if want is None:
        stats[n] = pooled()
    elif want[-1] > n:
        raise ValueError(f"pooled_norm_statistics: asked for the statistics after {want[-1]} batches; "
                         f"there were {n}")
    return n, stats


def set_running_stats(model: nn.Module, stats: dict) -> None:
    """Write ``{norm name: (mean, variance)}`` (one entry of ``pooled_norm_statistics``) into the running
    statistics of ``model``'s ``MaskedBatchNorm``s (in their dtype); every such norm must be named."""
    norms = {name: m for name, m in model.named_modules() if isinstance(m, MaskedBatchNorm)}
    if set(norms) != set(stats):
        raise ValueError(f"set_running_stats: the statistics name {sorted(set(stats) ^ set(norms))[:4]}, "
                         f"which the model's batch norms do not match")
    with torch.no_grad():
        for name, (mean, var) in stats.items():
            norms[name].running_mean.copy_(mean.to(norms[name].running_mean.dtype))
            norms[name].running_var.copy_(var.to(norms[name].running_var.dtype))
