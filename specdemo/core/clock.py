"""Reading a clock around device work: GPUs queue kernels and return at once, so a timer must
wait for the queue first (the CPU runs each op before returning: nothing to wait for)."""

from __future__ import annotations

import torch


def sync(device: torch.device) -> None:
    """Wait for queued device work so that a clock read measures it (CUDA, MPS; no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
