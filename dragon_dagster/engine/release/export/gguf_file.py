"""One GGUF file from a transformers model directory: the weights under llama.cpp's tensor names, in one of
FORMATS, with the model metadata llama.cpp's converter writes for the architecture (vocab.py adds the tokenizer).

What the converter does per architecture, and we do the same:
- llama: q_proj and k_proj rows are permuted (llama.cpp applies rope to interleaved pairs, transformers to
  halves); transformers' GGUF loader permutes them back. `rope.dimension_count` and `vocab_size` are written.
- qwen2: q/k/v carry biases; no permutation.
- tied input and output embeddings (SmolLM2, small Qwen2.5): no `output.weight`, llama.cpp reuses token_embd.
Tensor types follow llama.cpp (tensor_type below): 1-D tensors (norms, biases) stay F32; 2-D ones take the
format's type, or F16 when their rows do not split into its blocks; below 8 bits the output matrix is Q8_0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ExportError

# The formats this export writes, largest first: every type the `gguf` package quantizes in Python (gguf.quants:
# a quantize_blocks of its own) that llama.cpp runs as a whole-model file type, each named as llama.cpp's
# --outtype / llama-quantize name it. transformers' GGUF loader reads them all back (it dequantizes with the same
# package), which the export's verification needs. The `export` kind's `formats` and `dragon export --format`
# take their choices from here.
FORMATS = ("f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
DEFAULT_FORMATS = ("f16", "q8_0")  # the rest are smaller and reply less like the model: asked for by name
# What the package also quantizes and we do not write, and why (a test holds FORMATS and this to the package).
NOT_OFFERED = {
    "tq1_0": "ternary weights (-1, 0, 1): only for models trained ternary (BitNet); any other model loses its weights",
    "tq2_0": "ternary weights (-1, 0, 1): only for models trained ternary (BitNet); any other model loses its weights",
    "mxfp4": "llama.cpp writes it for mixture-of-experts expert tensors only (MOSTLY_MXFP4_MOE), not a dense model",
}


@dataclass(frozen=True)
class Architecture:
    gguf_arch: str  # general.architecture, the key prefix of the model metadata
    permute_qk: bool  # llama.cpp's rope layout for q/k rows
    writes_vocab_size: bool  # llama writes <arch>.vocab_size and rope.dimension_count, qwen2 does not
    allows_attention_bias: bool


# transformers' architectures (config.json) we export; another one is refused with its name.
SUPPORTED_ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": Architecture("llama", permute_qk=True, writes_vocab_size=True, allows_attention_bias=False),
    "Qwen2ForCausalLM": Architecture("qwen2", permute_qk=False, writes_vocab_size=False, allows_attention_bias=True),
}


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise ExportError(f"{model_dir} is not a model directory (no config.json)")
    return json.loads(path.read_text())


def architecture_of(config: dict) -> Architecture:
    names = config.get("architectures") or [config.get("model_type", "unknown")]
    arch = SUPPORTED_ARCHITECTURES.get(names[0])
    if arch is None:
        raise ExportError(
            f"cannot export a {names[0]} model to GGUF: supported architectures are "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def rope_theta(config: dict) -> float:
    """rope_theta from either config layout (transformers 5: rope_parameters); scaled rope types are refused,
    since llama.cpp would need their extra keys (and llama3's rope_freqs tensor) to run them the same."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind != "default":
        raise ExportError(f"rope type {kind!r} is not supported by this GGUF export (only plain rope)")
    theta = params.get("rope_theta", config.get("rope_theta"))
    if theta is None:
        raise ExportError("config.json has no rope_theta")
    return float(theta)


def load_weights(model_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the model's safetensors (one file or shards) as float32 numpy: bf16 has no numpy type,
    so the file is read through torch."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{model_dir} has no .safetensors weights (save the model with safe_serialization)")
    weights = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name).float().numpy()
    return weights


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf LlamaModel.permute: each head's rows from halves to interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_tensors(config: dict, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights under GGUF tensor names, in the converter's layout."""
    import gguf

    arch = architecture_of(config)
    n_layers = config["num_hidden_layers"]
    n_head, n_head_kv = config["num_attention_heads"], config.get("num_key_value_heads")
    model_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch.gguf_arch)
    names = gguf.get_tensor_name_map(model_arch, n_layers)
    tied = config.get("tie_word_embeddings", False)
    out = {}
    for hf_name, data in weights.items():
        if hf_name == "lm_head.weight" and tied:
            continue  # llama.cpp reuses token_embd for the output when there is no output.weight
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue  # recomputed from rope.freq_base
        if hf_name.endswith(".bias") and not arch.allows_attention_bias:
            raise ExportError(f"a {arch.gguf_arch} model with biases ({hf_name}) is not supported by this export")
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(f"no GGUF name for tensor {hf_name!r} of this {arch.gguf_arch} model")
        if arch.permute_qk and hf_name.endswith("q_proj.weight"):
            data = permute(data, n_head, n_head)
        elif arch.permute_qk and hf_name.endswith("k_proj.weight"):
            data = permute(data, n_head, n_head_kv)
        out[name] = data
    if not tied and "output.weight" not in out:
        raise ExportError("the model has untied embeddings but no lm_head.weight")
    return out


def quant_type(fmt: str):
    """The gguf.GGMLQuantizationType of a format name (they share llama.cpp's names)."""
    import gguf

    return gguf.GGMLQuantizationType[fmt.upper()]


def tensor_type(name: str, data: np.ndarray, fmt: str, tied: bool):
    """The type a tensor is stored in, as llama.cpp would store it in a file of this format:
    - 1-D tensors (norms, biases) stay F32, as the converter keeps them: they are tiny and quantizing them
      costs accuracy for nothing;
    - a matrix whose rows do not split into the type's blocks (32 values for q*_0/q*_1) falls back to F16, as
      the converter does when gguf raises QuantError;
    - below 8 bits the output matrix (output.weight, or token_embd when the output reuses it) is Q8_0:
      llama-quantize keeps it at Q6_K (Q8_0 when its rows are not a multiple of 256, as SmolLM2's 576 are),
      since every reply token comes out of it; the gguf package cannot write Q6_K, so Q8_0 is its nearest."""
    import gguf

    if data.ndim <= 1:
        return gguf.GGMLQuantizationType.F32
    qtype = quant_type(fmt)
    bits = gguf.GGML_QUANT_SIZES[qtype][1] * 8 / gguf.GGML_QUANT_SIZES[qtype][0]
    if bits < 8 and (name == "output.weight" or (tied and name == "token_embd.weight")):
        qtype = gguf.GGMLQuantizationType.Q8_0
    if data.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] != 0:
        return gguf.GGMLQuantizationType.F16
    return qtype


def tensor_payload(data: np.ndarray, qtype):
    """(array, raw_dtype) for GGUFWriter.add_tensor: F32 and F16 as numpy floats, the rest as quantized bytes."""
    import gguf

    if qtype == gguf.GGMLQuantizationType.F32:
        return data.astype(np.float32), None
    if qtype == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16), None
    return gguf.quants.quantize(data.astype(np.float32), qtype), qtype


def add_model_metadata(
    writer, config: dict, arch: Architecture, fmt: str, n_vocab: int, n_params: int, general: dict
) -> None:
    import gguf

    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(general["name"])
    if general.get("basename"):
        writer.add_basename(general["basename"])
    writer.add_size_label(gguf.size_label(n_params, 0, 0, 0))
    writer.add_license(general.get("license") or "unknown")
    if general.get("base_model"):
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, general["base_model"])
        if general.get("base_model_repo"):
            writer.add_base_model_repo_url(0, f"https://huggingface.co/{general['base_model_repo']}")
    hidden, n_head = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // n_head
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(config.get("num_key_value_heads") or n_head)
    writer.add_rope_freq_base(rope_theta(config))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if head_dim != hidden // n_head:  # the converter writes these when head_dim is its own setting
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch.writes_vocab_size:
        writer.add_vocab_size(n_vocab)
        writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{fmt.upper()}"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_gguf(model_dir: str | Path, path: str | Path, fmt: str, general: dict) -> dict:
    """Write one GGUF file; general: name, and optionally basename, license, base_model, base_model_repo.
    Returns {"path", "format", "tensors", "parameters"}."""
    import gguf

    from .vocab import add_tokenizer

    if fmt not in FORMATS:
        raise ExportError(f"unknown GGUF format {fmt!r}; known: {', '.join(FORMATS)}")
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    arch = architecture_of(config)
    rope_theta(config)  # refuse a scaled rope before the slow part
    if config.get("use_sliding_window"):
        raise ExportError("sliding-window attention is not supported by this GGUF export")
    tensors = gguf_tensors(config, load_weights(model_dir))
    n_params = sum(int(t.size) for t in tensors.values())
    writer = gguf.GGUFWriter(str(path), arch.gguf_arch)
    n_vocab = add_tokenizer(writer, model_dir, config["vocab_size"])
    add_model_metadata(writer, config, arch, fmt, n_vocab, n_params, general)
    tied = config.get("tie_word_embeddings", False)
    for name, data in tensors.items():
        array, raw_dtype = tensor_payload(data, tensor_type(name, data, fmt, tied))
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"path": str(path), "format": fmt, "tensors": len(tensors), "parameters": n_params}
