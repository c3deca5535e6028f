#!/usr/bin/env python3
"""Control for the Pathfinder fit probe: can a pixel MLP memorise the same small training split?

    python data_prep/lra_pathfinder.py --dest /tmp/pfprobe/gen --num 600 --size 32 --workers 2 --seed 5
    python data_prep/prepare_lra.py pathfinder --source /tmp/pfprobe/gen --dest /tmp/pfprobe/bin
    python bench/explore/lra_pathfinder_mlp_control.py /tmp/pfprobe/bin

An MLP (1024 -> 256 -> 2, full-batch Adam, lr 1e-3) on the task's normalisation (mean 0.5, std 0.5).
If it memorises the split, the images and their labels are consistent; a model that does not fit the
same split in a comparable budget is not failing on the data.
"""
import sys

import numpy as np
import torch
import torch.nn as nn


def load(d, split):
    x = np.load(f"{d}/{split}.pixels.npy")
    x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - 0.5) / 0.5
    return torch.tensor(x), torch.tensor(np.load(f"{d}/{split}.label.npy")).long()


def main(d):
    torch.manual_seed(0)
    (X, Y), (VX, VY) = load(d, "train"), load(d, "valid")
    m = nn.Sequential(nn.Linear(X.shape[1], 256), nn.ReLU(), nn.Linear(256, 2))
    opt = torch.optim.Adam(m.parameters(), 1e-3)
    for step in range(1, 301):
        loss = nn.functional.cross_entropy(m(X), Y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in (10, 30, 100, 300):
            with torch.no_grad():
                tr = (m(X).argmax(1) == Y).float().mean().item() * 100
                va = (m(VX).argmax(1) == VY).float().mean().item() * 100
            print(f"step {step}: train {tr:.1f}% valid {va:.1f}% loss {loss.item():.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
