"""Data-parallel training (`workers: N`): which rank this process is, how the global batch splits, and how the
ranks agree to stop.

The training resource puts `parallel` (config/job.py's Parallel: workers, backend torchrun or ray, resources per
worker) into a training job with more than one worker. Under torchrun every rank runs the
worker; under Ray the worker is the Ray job's driver and starts a Ray Train TorchTrainer whose workers run the
same stage function (runtime/ray_driver.py). Either way transformers' Trainer (through accelerate) finds the process
group from the torchrun-style variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, which both
torchrun and Ray Train set, and wraps the model in DistributedDataParallel.

Only rank 0 speaks: it alone opens Dagster Pipes, writes the artifact's files and status.json and returns the
result; the other ranks print to stdout with a `[rank k]` prefix (several writers would corrupt the channel).
"""

from __future__ import annotations

import os

from ..config.reporter import Reporter


def rank() -> int:
    """This process's rank among the data-parallel workers (0 when alone)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """How many data-parallel workers train together (1 when alone)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    """Rank 0: the one that reports, writes the artifact and returns the result."""
    return rank() == 0


def under_torchrun() -> bool:
    """Started by torchrun (its agent is this process's parent, not the process that launched the job)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def bind_device() -> None:
    """With several ranks on a GPU machine, each takes the GPU of its LOCAL_RANK before its model loads:
    loading on "cuda" would otherwise put every rank's model on GPU 0 (and a 4-bit one, which the trainer
    does not move, would stay there)."""
    if world_size() < 2:
        return
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def split_batch(batch_size: int, workers: int, what: str = "batch_size") -> int:
    """Each worker's share of a global batch; the settings name the global batch so that a run's loss curve
    does not depend on how many workers share it."""
    if batch_size % workers:
        raise ValueError(
            f"{what} ({batch_size}) must be divisible by the number of workers ({workers}): "
            f"it is the global batch, split evenly across the workers"
        )
    return batch_size // workers


def agree(flag: bool) -> bool:
    """True on every rank when it is true on any (an all-reduce, MAX); the flag itself when alone.

    Ranks that stopped at different steps would hang in the next collective, so a stop request (a signal that
    reached one rank first, a Ray driver's request polled by rank 0) is agreed each step.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    import torch

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # nccl reduces GPU tensors only
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def weights_digest(model) -> str:
    """A sha256 over the trainable weights, in name order: equal on two ranks only if the weights are."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def check_in_sync(model, log) -> None:
    """After training with several ranks: every rank must hold the same trainable weights, else the gradients
    were not synchronised and rank 0's adapter is one rank's view. Logs the digest; raises when they differ."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    digests: list = [None] * dist.get_world_size()
    dist.all_gather_object(digests, weights_digest(model))
    if len(set(digests)) > 1:
        raise RuntimeError(
            f"the data-parallel ranks ended with different weights (sha256 per rank: {digests}): "
            f"their gradients were not synchronised"
        )
    log(f"trainable weights identical on all {len(digests)} ranks (sha256 {digests[0][:16]})")


class RankReporter(Reporter):
    """A rank other than 0: its log lines go to stdout, marked; metrics are rank 0's to send."""

    def __init__(self, rank_: int):
        super().__init__()
        self.rank = rank_

    def log(self, message: str) -> None:
        print(f"[rank {self.rank}] {message}", flush=True)
