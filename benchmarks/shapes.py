"""The model shapes the benchmarks build with random weights: tiny (a few minutes on CPU), smol (SmolLM2-135M) and
the default Qwen2.5-0.5B. compare_trl.py saves them for both sides; limits.py counts their FLOPs and bytes."""

from __future__ import annotations


def arch_config(arch: str, vocab: int):
    """The anchor's model shapes."""
    from transformers import LlamaConfig, Qwen2Config

    if arch == "tiny":
        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
        )
    if arch == "smol":
        return LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        )
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )
