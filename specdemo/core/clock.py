"""Reading a clock around device work: GPUs queue kernels and return at once, so a timer must
wait for the queue first (the CPU runs each op before returning: nothing to wait for). And where
small results are read: on a CPU through numpy, on a device in one transfer."""

from __future__ import annotations

import torch


def sync(device: torch.device) -> None:
    """Wait for queued device work so that a clock read measures it (CUDA, MPS; no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


HOST_READS = True  # tests of the accelerator code path set it False to run that path on a CPU


def read_on_host(tensor: torch.Tensor) -> bool:
    """Whether small results of ``tensor`` (argmaxes, a top probability) are read through numpy:
    a CPU tensor, where torch's small-tensor ops cost 20-360 us each beside the native target's
    threads and there is no transfer to save. On a device they stay tensors until one transfer."""
    return HOST_READS and tensor.device.type == "cpu"
