"""``--optimizer torch_adamw``: fairseq's ``adam`` (AdamW-style decoupled weight decay) as one fused
PyTorch kernel per step instead of a Python loop over the parameters.

Without NVIDIA's apex (not installable on our stack), fairseq's ``adam`` runs its own
``fairseq.optim.adam.Adam``: about ten small kernels per parameter tensor, and its gradient-norm
computation is one more kernel per tensor. On the small LRA and MQAR models (many small tensors) that
launch overhead is a large share of an update.

This optimizer is ``torch.optim.AdamW`` (``fused=True`` on CUDA: every parameter in one launch) with
the same options as fairseq's ``adam`` (``--adam-betas``, ``--adam-eps``, ``--weight-decay``, the lr
from ``--lr`` and the scheduler), and a gradient norm from ``torch._foreach_norm`` (one launch).
The update is the same rule: decoupled weight decay ``p -= lr * wd * p``, then Adam with bias
correction. One difference of rounding size: fairseq adds eps to ``sqrt(v)`` before dividing by the
bias correction ``sqrt(1 - beta2^t)``; PyTorch adds it after, so early steps see an eps larger by
``1 / sqrt(1 - beta2^t)`` (1e-8 against gradients' sqrt(v), invisible unless gradients are ~1e-8).
It works under fairseq's ``--bf16`` / ``--fp16`` wrapper (fp32 master weights; flattened into one
tensor for fp16, per tensor for bf16). A
checkpoint trained with ``adam`` resumes with it only with ``--reset-optimizer`` (fairseq refuses a
different optimizer class, as for any change of optimizer).
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf


@dataclass
class TorchAdamWConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay (AdamW)"})
    lr: List[float] = II("optimization.lr")


def total_grad_norm(grads: List[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all ``grads`` together, in float32, one multi-tensor launch per device and dtype."""
    if not grads:
        return torch.zeros(())
    norms = torch._foreach_norm([g if g.dtype == torch.float32 else g.float() for g in grads], 2)
    return torch.linalg.vector_norm(torch.stack([n.to(grads[0].device) for n in norms]), 2)


@register_optimizer("torch_adamw", dataclass=TorchAdamWConfig)
class TorchAdamW(FairseqOptimizer):
    def __init__(self, cfg: TorchAdamWConfig, params):
        super().__init__(cfg)
        params = list(params)
        tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
        fused = bool(tensors) and all(p.is_cuda and p.dtype in (torch.float32, torch.float16, torch.bfloat16)
                                      for p in tensors)
        self._optimizer = torch.optim.AdamW(params, **self.optimizer_config, fused=fused or None,
                                            foreach=None if fused else True)

    @property
    def optimizer_config(self):
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        betas = self.cfg.adam_betas
        betas = eval(betas) if isinstance(betas, str) else OmegaConf.to_container(betas) \
            if OmegaConf.is_config(betas) else betas
        return {"lr": lr, "betas": tuple(betas), "eps": self.cfg.adam_eps, "weight_decay": self.cfg.weight_decay}

    @property
    def supports_flat_params(self):
        return True

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        """fairseq's contract: returns the total norm (before clipping), clips when ``max_norm > 0``."""
        grads = [p.grad.detach() for p in self.params if p.grad is not None]
        if not grads:
            return self.params[0].new_tensor(0.0) if self.params else torch.tensor(0.0)
        total = total_grad_norm(grads)
        if aggregate_norm_fn is not None:
            total = aggregate_norm_fn(total)
        if max_norm > 0:
            coef = (float(max_norm) / (total + 1e-6)).clamp_(max=1)
            torch._foreach_mul_(grads, coef)
        return total
