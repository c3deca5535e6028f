"""``MaskedBatchNorm(sync=True)`` (the LRA recipes' ``syncbatch``) over two processes (gloo on CPU; NCCL on
two GPUs where there are two), against
batch norm written out in float64 over the union of both processes' valid positions: outputs, the
gradients of the inputs (through the all-reduce) and of the affine parameters, and the running statistics.
The two processes hold different numbers of valid positions, so averaging per-process statistics (or not
syncing at all) fails."""
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hgrn_fairseq.modules.norms import MaskedBatchNorm

pytestmark = pytest.mark.integration

DIM, EPS, MOMENTUM = 3, 1e-5, 0.1


def _inputs(rank):
    """Rank r's batch ``[2, 5, DIM]`` (float64), its padding mask (rank 0: 1 pad, rank 1: 6) and the loss
    weights."""
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(2, 5, DIM, generator=g, dtype=torch.float64) * (1 + 2 * rank) + 3 * rank
    pads = torch.zeros(2, 5, dtype=torch.bool)
    if rank == 0:
        pads[1, 4] = True
    else:
        pads[0, 2:] = True
        pads[1, 2:] = True
    w = torch.randn(2, 5, DIM, generator=g, dtype=torch.float64)
    return x, pads, w


def _params():
    g = torch.Generator().manual_seed(7)
    return (1 + 0.5 * torch.randn(DIM, generator=g, dtype=torch.float64),
            0.5 * torch.randn(DIM, generator=g, dtype=torch.float64))


def _forward_backward(rank, sync, device):
    """Rank ``rank``'s batch through the module, its loss backpropagated: outputs, gradients and running
    statistics on the CPU."""
    bn = MaskedBatchNorm(DIM, eps=EPS, momentum=MOMENTUM, sync=sync).double().train().to(device)
    weight, bias = _params()
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    x, pads, w = (t.to(device) for t in _inputs(rank))
    x.requires_grad_()
    y = bn(x, pads)
    (y * w).sum().backward()
    out = {"y": y.detach(), "dx": x.grad, "dweight": bn.weight.grad, "dbias": bn.bias.grad,
           "running_mean": bn.running_mean, "running_var": bn.running_var}
    return {k: v.cpu() for k, v in out.items()}


def _worker(rank, world, folder, backend):
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        # gloo on loopback: a container's hostname may resolve to an interface the peers cannot reach.
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        torch.save(_forward_backward(rank, True, device), os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _reference():
    """Batch norm over both ranks' valid positions, written out in float64; per rank: y, dx of the summed
    losses, and the affine gradients of that rank's own loss (what the module accumulates locally)."""
    weight, bias = _params()
    xs, pads, ws = zip(*(_inputs(r) for r in range(2)))
    xs = [x.clone().requires_grad_() for x in xs]
    valid = torch.cat([x[~p] for x, p in zip(xs, pads)])  # [n, DIM], every valid position of both ranks
    n = valid.shape[0]
    mean = valid.mean(0)
    var = ((valid - mean) ** 2).mean(0)  # biased, as batch norm normalises
    wp, bp = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    ys = [((x - mean) / torch.sqrt(var + EPS) * wp + bp) * (~p).unsqueeze(-1) for x, p in zip(xs, pads)]
    losses = [(y * w).sum() for y, w in zip(ys, ws)]
    dxs = torch.autograd.grad(sum(losses), xs, retain_graph=True)
    affine = [torch.autograd.grad(loss, (wp, bp), retain_graph=True) for loss in losses]
    running_mean = (1 - MOMENTUM) * 0 + MOMENTUM * mean.detach()
    running_var = (1 - MOMENTUM) * 1 + MOMENTUM * var.detach() * n / (n - 1)
    return [dict(y=ys[r].detach(), dx=dxs[r], dweight=affine[r][0], dbias=affine[r][1],
                 running_mean=running_mean, running_var=running_var) for r in range(2)]


def _run(tmp_path, backend="gloo"):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.fail("torch.distributed with gloo is needed for this test")
    mp.spawn(_worker, args=(2, str(tmp_path), backend), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]


TWO_GPUS = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
    reason="needs 2 GPUs and NCCL (TRITON_INTERPRET unset)")


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=[pytest.mark.gpu, TWO_GPUS])])
def test_sync_batch_norm_over_two_processes_is_batch_norm_over_their_union(tmp_path, backend):
    got, want = _run(tmp_path, backend=backend), _reference()
    for rank in range(2):
        for key in want[rank]:
            torch.testing.assert_close(got[rank][key], want[rank][key], rtol=1e-10, atol=1e-12,
                                       msg=lambda m, k=key, r=rank: f"rank {r}, {k}: {m}")


def test_unsynced_batch_norm_differs_from_the_union():
    """The check above can fail: one process's own statistics (what an unsynced norm uses) give other
    outputs. No process group is needed: without one the module normalises over the local batch."""
    got, want = _forward_backward(1, False, torch.device("cpu")), _reference()
    assert not torch.allclose(got["y"], want[1]["y"], rtol=1e-6, atol=1e-6)
