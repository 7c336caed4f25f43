"""``train_cuda.py``'s training loop written for a CPU: the baseline the redirected CUDA version must match."""

import argparse
import json
import time

import torch
import torch.nn as nn


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))


def train(steps: int, batch: int = 64) -> dict:
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    weights = torch.randn(64, 10)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        inputs = torch.randn(batch, 64)
        targets = (inputs @ weights).argmax(dim=1)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "losses": losses,
        "params": [p.detach() for p in model.parameters()],
        "peak_memory": 0,
        "device": str(next(model.parameters()).device),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    result = train(args.steps)
    print(json.dumps({"seconds": result["seconds"], "final_loss": result["losses"][-1], "device": result["device"]}))
