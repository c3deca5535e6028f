"""fairseq_compat fix 1 on several processes: with DDP only rank 0 reads a checkpoint and sends it to the
others as a pickle (``fairseq.distributed.utils.broadcast_object``). torch >= 2.6 unpickled it with
``weights_only=True`` and refused fairseq's configs, so every multi-GPU resume failed; unpickled fully, it would
run whatever the state carried. Two gloo processes on CPU send a checkpoint-like object with an omegaconf
config (received), then one carrying code (refused on the receiving rank, which runs none of it)."""
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.integration


def _worker(rank, folder):
    import hgrn_fairseq
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import OmegaConf

    from hgrn_fairseq.checkpoint_io import UnsafeCheckpointError
    from tests.hostile_checkpoints import RunsCode

    hgrn_fairseq.register()  # the compat fixes, as --user-dir applies them
    # gloo on loopback: a container's hostname may resolve to an interface the peers cannot reach
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2,
                            timeout=timedelta(seconds=120))
    try:
        sent = None
        if rank == 0:
            sent = {"cfg": OmegaConf.create({"model": {"norm": "syncbatch"}, "optimization": {"lr": [5e-4]}}),
                    "model": {"w": torch.arange(6.0).reshape(2, 3)}, "extra_state": {"epoch": 3}}
        got = distributed_utils.broadcast_object(sent, src_rank=0, group=dist.group.WORLD)
        result = {"norm": got["cfg"].model.norm, "lr": list(got["cfg"].optimization.lr), "w": got["model"]["w"],
                  "epoch": got["extra_state"]["epoch"]}
        # (the pickled part of broadcast_object: what the receiving ranks unpickle)
        hostile = {"cfg": None, "extra_state": RunsCode(os.path.join(folder, "MARKER"))}
        try:
            distributed_utils._broadcast_object_slow(hostile if rank == 0 else None, 0, dist.group.WORLD,
                                                     torch.device("cpu"))
            result["hostile"] = "received"
        except UnsafeCheckpointError as e:
            result["hostile"] = str(e)
        torch.save(result, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_broadcast_checkpoint_reaches_the_other_ranks_and_code_does_not(tmp_path):
    pytest.importorskip("fairseq")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.fail("torch.distributed with gloo is needed for this test")
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["norm"] == "syncbatch" and got["lr"] == [5e-4] and got["epoch"] == 3
        torch.testing.assert_close(got["w"], torch.arange(6.0).reshape(2, 3), rtol=0, atol=0)
    assert torch.load(tmp_path / "rank0.pt")["hostile"] == "received"  # the sender unpickles nothing
    refused = torch.load(tmp_path / "rank1.pt")["hostile"]
    assert "posix.system" in refused and "received from another process" in refused, refused
    assert not (tmp_path / "MARKER").exists()
