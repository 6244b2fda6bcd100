"""Where and how jobs run, set on the training resource (not in the pipeline): dragon_hardware's device,
dtype and 4-bit, and the speed choices that change cost but not learning. A stage's own settings are its
kind's model in stages.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class SettingsError(ValueError):
    """A setting is out of range or of the wrong kind."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise SettingsError(message)


DEVICES = ("auto", "cuda", "mps", "cpu")
DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Hardware:
    device: str = "auto"
    dtype: str = "auto"
    load_in_4bit: bool = False

    def validate(self) -> Hardware:
        _check(self.device in DEVICES, f"hardware.device must be one of {DEVICES}, got {self.device!r}")
        _check(self.dtype in DTYPES, f"hardware.dtype must be one of {DTYPES}, got {self.dtype!r}")
        return self


SWITCHES = ("auto", "on", "off")
LOSS_KERNELS = ("auto", "chunked", "trl")
DROPOUT_MASKS = ("auto", "fast", "torch")
SAMPLINGS = ("auto", "grouped", "trl")


@dataclass(frozen=True)
class Speed:
    """How a trainer runs fast: same learning, different cost. "auto" picks per device (see resolve)."""

    packing: str = "auto"  # SFT: pack rows into max_seq_len rows (padding-free, isolated attention)
    loss_kernel: str = "auto"  # chunked: ours, trained positions only; trl: TRL's fused head
    generation_batch_size: int | None = None  # GRPO: completions sampled per generation round (None: one step's)
    torch_compile: bool = False
    unpad: str = "auto"  # chunked head: the backbone runs over real tokens only (no padding)
    dropout_mask: str = "auto"  # fast: LoRA dropout masks from 16-bit draws (train/dropout.py); torch
    sampling: str = "auto"  # GRPO: grouped prefills each prompt once, samples in eval mode (rollout.py)

    def validate(self) -> Speed:
        _check(self.packing in SWITCHES, f"speed.packing must be one of {SWITCHES}, got {self.packing!r}")
        _check(
            self.loss_kernel in LOSS_KERNELS,
            f"speed.loss_kernel must be one of {LOSS_KERNELS}, got {self.loss_kernel!r}",
        )
        _check(self.unpad in SWITCHES, f"speed.unpad must be one of {SWITCHES}, got {self.unpad!r}")
        _check(
            self.dropout_mask in DROPOUT_MASKS,
            f"speed.dropout_mask must be one of {DROPOUT_MASKS}, got {self.dropout_mask!r}",
        )
        _check(self.sampling in SAMPLINGS, f"speed.sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        _check(
            self.generation_batch_size is None
            or (isinstance(self.generation_batch_size, int) and self.generation_batch_size > 0),
            f"speed.generation_batch_size must be a positive integer or null, got {self.generation_batch_size!r}",
        )
        return self

    def resolve(self, device: str) -> Speed:
        """Concrete choices for a device. On CUDA, packing fills the GPU and TRL's Triton head is used; elsewhere
        the chunked head wins (3-4x faster than TRL's torch fallback on a CPU) and rows stay unpacked, so a step
        holds batch_size examples as the user set it, but run without their padding (unpad), and LoRA dropout
        draws its masks 16 bits at a time (torch's per-element draws cost a CPU more than the attention)."""
        gpu = device == "cuda"
        packing = self.packing if self.packing != "auto" else ("on" if gpu else "off")
        kernel = self.loss_kernel if self.loss_kernel != "auto" else ("trl" if gpu else "chunked")
        unpad = self.unpad if self.unpad != "auto" else ("off" if gpu else "on")
        mask = self.dropout_mask if self.dropout_mask != "auto" else ("torch" if gpu else "fast")
        sampling = "grouped" if self.sampling == "auto" else self.sampling  # less work on any device
        return dataclasses.replace(
            self, packing=packing, loss_kernel=kernel, unpad=unpad, dropout_mask=mask, sampling=sampling
        )


def build(cls: type, values: dict[str, Any] | None, where: str):
    """Make a settings object from a mapping, naming unknown keys instead of ignoring them."""
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    _check(not unknown, f"{where}: unknown setting(s) {unknown}; known: {sorted(known)}")
    return cls(**values).validate()


__all__ = ["Hardware", "Speed", "SettingsError", "build"]
