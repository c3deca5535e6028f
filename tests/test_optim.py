"""``--optimizer torch_adamw``: the update against a float64 AdamW written out here, against fairseq's
own ``adam`` (the rule it replaces), the gradient norm and clipping against fairseq's
``clip_grad_norm_``, and building it from fairseq options, under fairseq's ``--bf16`` wrapper included."""
import math

import pytest
import torch
from fairseq import optim as fairseq_optim
from omegaconf import OmegaConf

import hgrn_fairseq
hgrn_fairseq.register()  # the plugin's models, tasks and criterions, as --user-dir does
from hgrn_fairseq.optim import TorchAdamW, TorchAdamWConfig, total_grad_norm


def cfg(lr=1e-2, wd=0.1, betas=(0.9, 0.99), eps=1e-8):
    return OmegaConf.structured(TorchAdamWConfig(adam_betas=str(betas), adam_eps=eps, weight_decay=wd, lr=[lr]))


def adamw_by_hand(p, grads, lrs, wd, b1, b2, eps):
    """p_{t} = p_{t-1} (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps), float64, step by step."""
    p = p.clone().double()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        g = g.double()
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        p = p - lr * m_hat / (v_hat.sqrt() + eps)
    return p


def run(opt_builder, p0, grads, lrs):
    p = torch.nn.Parameter(p0.clone())
    opt = opt_builder([p])
    for g, lr in zip(grads, lrs):
        opt.set_lr(lr)
        p.grad = g.clone().to(p.dtype)
        opt.step()
        opt.zero_grad()
    return p.detach()


def test_update_matches_float64_adamw_and_fairseq_adam():
    g = torch.Generator().manual_seed(0)
    p0 = torch.randn(7, 5, generator=g, dtype=torch.float64)
    grads = [torch.randn(7, 5, generator=g, dtype=torch.float64) * 0.1 for _ in range(6)]
    lrs = [1e-2, 2e-2, 3e-2, 2e-2, 1e-2, 5e-3]  # the scheduler changes it between steps
    want = adamw_by_hand(p0, grads, lrs, wd=0.1, b1=0.9, b2=0.99, eps=1e-8)
    ours = run(lambda ps: TorchAdamW(cfg(), ps), p0, grads, lrs)
    torch.testing.assert_close(ours, want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(ours, adamw_by_hand(p0, grads, lrs, wd=0.0, b1=0.9, b2=0.99, eps=1e-8))
    # fairseq's adam (the Python Adam it runs without apex) follows the same rule; only eps's place differs
    fair_cfg = OmegaConf.create({"_name": "adam", "adam_betas": "(0.9, 0.99)", "adam_eps": 1e-8,
                                 "weight_decay": 0.1, "use_old_adam": True, "fp16_adam_stats": False,
                                 "tpu": False, "lr": [1e-2]})
    theirs = run(lambda ps: fairseq_optim.build_optimizer(fair_cfg, ps), p0, grads, lrs)
    # (fairseq's eps is eps / sqrt(1 - beta2^t) of ours: 10x at t = 1 with beta2 0.99, against
    # sqrt(v) ~ 0.01 here: ~1e-5 relative, and nothing else differs)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(theirs, run(lambda ps: TorchAdamW(cfg(wd=0.0), ps), p0, grads, lrs), rtol=1e-4, atol=1e-6)


def test_grad_norm_and_clipping_match_fairseq():
    from fairseq import utils

    g = torch.Generator().manual_seed(1)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    grads = [torch.randn(s, generator=g) for s in shapes]  # float32: fairseq norms in float32
    by_hand = math.sqrt(sum(float((x * x).sum()) for x in grads))
    assert float(total_grad_norm(grads)) == pytest.approx(by_hand, rel=1e-6)
    for max_norm in (0.0, 100.0, 0.5):
        ps = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
        qs = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
        for p, q, x in zip(ps, qs, grads):
            p.grad, q.grad = x.clone(), x.clone()
        ours = TorchAdamW(cfg(), ps).clip_grad_norm(max_norm)
        theirs = utils.clip_grad_norm_(qs, max_norm)
        assert float(ours) == pytest.approx(float(theirs), rel=1e-6) == pytest.approx(by_hand, rel=1e-6)
        for p, q, x in zip(ps, qs, grads):
            torch.testing.assert_close(p.grad, q.grad)
            if max_norm in (0.0, 100.0):  # no clipping (0: norm only)
                assert torch.equal(p.grad, x)
        if max_norm == 0.5:
            assert float(total_grad_norm([p.grad for p in ps])) == pytest.approx(0.5, rel=1e-5)


def test_built_from_fairseq_options_and_under_bf16(tmp_path):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(tmp_path), "--task", "language_modeling", "--arch",
                                                "transformer_lm", "--optimizer", "torch_adamw", "--lr", "0.003",
                                                "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01",
                                                "--bf16", "--cpu"])
    args.tpu = False
    c = convert_namespace_to_omegaconf(args)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(torch.bfloat16)
    opt = FP16Optimizer.build_optimizer(c, list(model.parameters()))  # fp32 master weights, one per tensor
    inner = opt.fp32_optimizer
    assert isinstance(inner, TorchAdamW)
    group = inner.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (0.003, (0.9, 0.98), 0.01)
    assert [p.dtype for p in group["params"]] == [torch.float32] * 4  # (fairseq flattens for fp16, not bf16)
    assert opt.supports_flat_params
    before = [p.detach().clone() for p in model.parameters()]
    opt.backward(model(torch.randn(5, 4, dtype=torch.bfloat16)).float().pow(2).sum())
    opt.clip_grad_norm(1.0)
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
