"""torchrun with 2 CPU processes (gloo) through the image entry point: DDP, gradient accumulation, the
sharded evaluation (every validation image counted once) and the checkpoint written by rank 0."""
import json
import os
import sys

import pytest
import torch

pytest.importorskip("timm")
from tests.image.test_train import TINY, make_image_folder  # noqa: E402
from tests import pyrun

pytestmark = pytest.mark.integration


def test_torchrun_two_processes(tmp_path):
    data, out = tmp_path / "data", tmp_path / "run"
    assert make_image_folder.main(["--dest", str(data), "--per-class", "5", "--size", "16"]) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "hgrn_fairseq.image.train", f"data.path={data}", f"train.output_dir={out}", "optim.epochs=1",
           "optim.warmup_epochs=0", *[a for a in TINY if not a.startswith("optim.batch_size")],
           "optim.batch_size=8", "optim.max_batch_per_gpu=2"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = pyrun.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    log = [json.loads(line) for line in open(out / "log.jsonl")]
    start = log[0]
    assert (start["processes"], start["batch_per_process"], start["accumulation"]) == (2, 2, 2)
    ev = [e for e in log if e["event"] == "eval"]
    assert len(ev) == 1 and ev[0]["images"] == 6  # 6 validation images over 2 processes, none twice
    # RepeatAugSampler (DeiT's rule): an epoch is as many samples as the data set, 24 / 2 = 12 a process
    # (each image 3 times in the repeated list): 6 batches of 2 = 3 updates of 2 batches
    state = torch.load(out / "checkpoint_last.pt", weights_only=True)
    assert (state["epoch"], state["num_updates"]) == (1, 3)
    # one log line per event: only rank 0 writes
    assert sum(1 for e in log if e["event"] == "start") == 1
