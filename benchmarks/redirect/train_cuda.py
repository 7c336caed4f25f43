"""A small training loop written the way CUDA projects write it (the redirect's test and benchmark workload).

Every CUDA habit the redirect must handle appears here: ``.cuda()`` on the model and batches, ``device="cuda"``,
``torch.cuda.manual_seed``, ``torch.cuda.amp.autocast`` with a ``GradScaler``, ``torch.cuda.synchronize`` and
``torch.cuda.max_memory_allocated``. ``train_cpu.py`` is the same computation written for a CPU.
Run: ``python train_cuda.py --steps 50`` on a GPU, or under ``npu_port.redirect_cuda("cpu")`` anywhere.
"""

import argparse
import json
import time

import torch
import torch.nn as nn


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))


def train(steps: int, batch: int = 64) -> dict:
    torch.manual_seed(0)
    torch.cuda.manual_seed(0)
    model = build_model().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.cuda.amp.GradScaler(init_scale=1024.0)
    weights = torch.randn(64, 10, device="cuda")
    losses = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        inputs = torch.randn(batch, 64).cuda()
        targets = (inputs @ weights).argmax(dim=1)
        with torch.cuda.amp.autocast():  # float16, CUDA autocast's default
            loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "losses": losses,
        "params": [p.detach() for p in model.parameters()],
        "peak_memory": torch.cuda.max_memory_allocated(),
        "device": str(next(model.parameters()).device),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    result = train(args.steps)
    print(json.dumps({"seconds": result["seconds"], "final_loss": result["losses"][-1], "device": result["device"]}))
