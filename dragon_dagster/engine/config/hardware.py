"""Where and how jobs run, set on the training resource (not in the pipeline): dragon_hardware's device, dtype and
4-bit, and the speed choices (docs/performance.md says what each changes besides cost). These two models are the one
definition: the training resource's fields are generated from them (resources/training.py), the worker's job
carries them, the docs list them.
A stage's own settings are its kind's model (stages/<kind>/settings.py).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field, ValidationError

from .settings import Settings


class SettingsError(ValueError):
    """A setting is out of range or of the wrong kind."""


class Hardware(Settings):
    """Where a job runs and in what precision."""

    model_config = ConfigDict(frozen=True)

    device: Literal["auto", "cuda", "mps", "cpu"] = Field("auto", description="Where to train.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="auto: bfloat16 on GPUs that support it, float32 on CPU/MPS."
    )
    load_in_4bit: bool = Field(
        False,
        description="QLoRA: load the base model in 4-bit (CUDA only; needs bitsandbytes: pip install "
        "'dragon-dagster[gpu]'). Never run yet.",
    )


class Speed(Settings):
    """How a trainer runs fast. "auto" picks per device (see resolve)."""

    model_config = ConfigDict(frozen=True)

    packing: Literal["auto", "on", "off"] = Field(
        "auto",
        description="SFT: pack rows into max_seq_len rows, each sequence attending only to itself. auto: on for "
        "CUDA (fills the GPU), off elsewhere (a step keeps batch_size rows).",
    )
    loss_kernel: Literal["auto", "chunked", "trl"] = Field(
        "auto",
        description="Loss head. chunked: projects only trained positions, gradient formed in forward; trl: TRL's "
        "fused head (Triton on GPUs). auto: trl on CUDA, else chunked.",
    )
    generation_batch_size: int | None = Field(
        None,
        gt=0,
        description="GRPO: completions sampled per generation round, reused over several optimizer steps (TRL "
        "generation_batch_size; a multiple of batch_size x group_size). null: one step's worth.",
    )
    torch_compile: bool = Field(False, description="Compile the model with torch.compile before training.")
    unpad: Literal["auto", "on", "off"] = Field(
        "auto",
        description="With the chunked head, run the model over the real tokens of a batch only, each row "
        "attending to itself; a prompt several rows share runs once (with LoRA dropout, one draw for them all). "
        "auto: on except for CUDA.",
    )
    dropout_mask: Literal["auto", "fast", "torch"] = Field(
        "auto",
        description="LoRA dropout masks: fast draws 16 bits per element (CPU), torch one 32-bit number. auto: "
        "fast except for CUDA.",
    )
    lora_product: Literal["auto", "accumulated", "peft"] = Field(
        "auto",
        description="LoRA layers in training: accumulated adds each adapter's product into the base layer's output "
        "inside the matrix product (its scaling as the product's factor), with no pass over the output for the "
        "scaling and the sum; peft: PEFT's forward. The same values. auto: accumulated except for CUDA.",
    )
    sampling: Literal["auto", "grouped", "trl"] = Field(
        "auto",
        description="GRPO sampling. grouped: each prompt's forward pass once for its group, no LoRA dropout "
        "while sampling, and this project's decoding loop for Llama-family models; trl: TRL's generate as is. "
        "auto: grouped.",
    )

    def resolve(self, device: str) -> Speed:
        """Concrete choices for a device. On CUDA, packing fills the GPU and TRL's Triton head is used; elsewhere
        the chunked head wins (3-4x faster than TRL's torch fallback on a CPU) and rows stay unpacked, so a step
        holds batch_size examples as the user set it, but run without their padding (unpad), LoRA dropout
        draws its masks 16 bits at a time (torch's per-element draws cost a CPU more than the attention) and LoRA
        layers accumulate their adapter's product into the base output (measured on CPUs only)."""
        gpu = device == "cuda"
        packing = self.packing if self.packing != "auto" else ("on" if gpu else "off")
        kernel = self.loss_kernel if self.loss_kernel != "auto" else ("trl" if gpu else "chunked")
        unpad = self.unpad if self.unpad != "auto" else ("off" if gpu else "on")
        mask = self.dropout_mask if self.dropout_mask != "auto" else ("torch" if gpu else "fast")
        lora_product = self.lora_product if self.lora_product != "auto" else ("peft" if gpu else "accumulated")
        sampling = "grouped" if self.sampling == "auto" else self.sampling  # less work on any device
        return self.model_copy(
            update={
                "packing": packing,
                "loss_kernel": kernel,
                "unpad": unpad,
                "dropout_mask": mask,
                "lora_product": lora_product,
                "sampling": sampling,
            }
        )


def build(cls: type[Settings], values: dict[str, Any] | Settings | None, where: str):
    """A settings object from a mapping, each problem named as `<where>.<field>`; unknown keys are named, not
    ignored."""
    if isinstance(values, cls):
        return values
    try:
        return cls.model_validate(dict(values or {}))
    except ValidationError as exc:
        unknown = sorted(str(e["loc"][0]) for e in exc.errors() if e["type"] == "extra_forbidden")
        if unknown:
            raise SettingsError(f"{where}: unknown setting(s) {unknown}; known: {sorted(cls.model_fields)}") from None
        problems = "; ".join(f"{where}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise SettingsError(problems) from None


DEVICES = get_args(Hardware.model_fields["device"].annotation)
DTYPES = get_args(Hardware.model_fields["dtype"].annotation)

__all__ = ["DEVICES", "DTYPES", "Hardware", "Speed", "SettingsError", "build"]
