"""This machine's limits, measured once, and the fraction of them our paths reach (issue 27).

    python benchmarks/limits.py --json out.json          # bandwidth, matmul peak, GRPO sampling's fraction
    python benchmarks/limits.py --skip-sampling          # the machine's limits only

Importable (benchmarks/compare_trl.py and others): memory_bandwidth(), matmul_peak(), sampling(),
sft_flops_per_token() / sft_achieved().

- memory bandwidth: STREAM-like, with torch on all threads, over float32 arrays far larger than any cache
  (1 GiB by default): "sum" reads the array once (read-bound, the kernel decoding is bound by: it reads every
  weight once per token and writes almost nothing); "copy" reads one array and writes another (STREAM's copy,
  counted as 2 x bytes, as STREAM counts it; without non-temporal stores the write also reads its line first,
  so copy reads lower than the hardware's). Best of several runs.
- matmul peak: float32 torch.mm of square matrices (2048 and 4096), best of several, all threads; 2 n^3 FLOPs.
- GRPO sampling: shapes.py's "smol" shape with random weights (SmolLM2-135M: 30 layers, hidden 576, MLP 1536,
  9 heads / 3 KV heads, vocabulary 49,152, tied head) under a LoRA of rank 16, alpha 32 on every linear layer,
  decoding 8 rows (one prompt x 8, GRPO's group_size 8) of 32 new tokens through rollout.sampling, as the
  grpo kind's trainer calls model.generate (TRL's generation config: do_sample, temperature 1, top_k 0,
  top_p 1, disable_compile). A decoding step reads every linear weight once in its decode dtype (float32 here;
  the LoRA adapters are folded into them, decode_weights.py) plus the head; embedding lookups are a few rows.
  bytes/s = weight bytes per step x steps/s, steps/s = 32 / the seconds of the whole generate call (what GRPO
  pays: weight packing and the prompt's prefill included) and, separately, over the decoding steps alone (from
  the time between the decoder's calls). Arithmetic intensity = matmul FLOPs per step / weight bytes per step:
  with 8 float32 rows that is 2 x 8 / 4 = 4 FLOP/byte, at or above this machine's ridge point (peak FLOP/s /
  bandwidth), so decoding is bound by the products' compute, not by reading the weights: the report gives both
  fractions and names the bound that applies (the lower of the two times).
- SFT: sft_flops_per_token() counts a LoRA forward+backward analytically (documented there);
  sft_achieved(tokens_per_s) turns a measured rate into FLOP/s and a fraction of the matmul peak.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GIB = 1 << 30


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first touch of pages, kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(gib: float = 1.0, repeats: int = 7) -> dict:
    """GB/s (10^9 bytes) of torch's sum (read-only) and copy (read + write) over float32 arrays of `gib` GiB."""
    n = int(gib * GIB) // 4
    a = torch.empty(n, dtype=torch.float32).uniform_()
    b = torch.empty_like(a)
    read = best_seconds(lambda: a.sum(), repeats)
    copy = best_seconds(lambda: b.copy_(a), repeats)
    return {
        "array_gib": gib,
        "threads": torch.get_num_threads(),
        "read_gb_s": round(n * 4 / read / 1e9, 2),
        "read_kernel": "torch.sum over one float32 array (bytes read / s)",
        "copy_gb_s": round(2 * n * 4 / copy / 1e9, 2),
        "copy_kernel": "Tensor.copy_ between two float32 arrays (STREAM copy: 2 x bytes / s)",
    }


def matmul_peak(sizes=(2048, 4096), repeats: int = 4) -> dict:
    """Best float32 GFLOP/s of torch.mm on square matrices, all threads."""
    found = {}
    for n in sizes:
        x, y = torch.randn(n, n), torch.randn(n, n)
        out = torch.empty(n, n)
        seconds = best_seconds(lambda x=x, y=y, out=out: torch.mm(x, y, out=out), repeats)
        found[n] = round(2 * n**3 / seconds / 1e9, 1)
    return {"gflop_s": max(found.values()), "by_size": found, "threads": torch.get_num_threads(), "dtype": "float32"}


def smol_lora_model(seed: int = 0):
    """shapes.py's smol shape with random weights, LoRA r 16 / alpha 32 on every linear layer, dropout 0."""
    from peft import LoraConfig, get_peft_model
    from shapes import arch_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(arch_config("smol", 49152), dtype=torch.float32)
    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    for layer in model.modules():  # PEFT starts B at zero; a trained adapter is not, and folding should show
        if hasattr(layer, "lora_B"):
            torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.01)
    model.train()  # as GRPO's trainer hands it to generate
    return model


def decode_weight_bytes(model) -> dict:
    """Bytes a decoding step reads: every linear weight of the decoder in its decode dtype, plus the head.

    The LoRA adapters are folded into their layers while decoding (decode_weights.py), so they are not counted.
    """
    adapters = {
        id(m)
        for layer in model.modules()
        if hasattr(layer, "lora_A")
        for m in (*layer.lora_A.values(), *layer.lora_B.values())
    }
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and id(m) not in adapters and m is not head]
    decoder = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    head_bytes = head.weight.numel() * head.weight.element_size()
    return {
        "decoder_linear_params": sum(m.weight.numel() for m in linears),
        "head_params": head.weight.numel(),
        "bytes_per_step": decoder + head_bytes,
    }


def attention_flops_per_step(config, rows: int, context: int) -> int:
    """QK and PV products of one decoding step at a context of `context` tokens."""
    return 2 * 2 * rows * config.num_hidden_layers * config.num_attention_heads * config.head_dim * context


def generation_config(new_tokens: int):
    """TRL GRPOTrainer's generation config (without vLLM) at its defaults. No min_new_tokens (TRL sets none): random
    weights draw the end token 2 with probability about 1/49152 a token, so the rows run to new_tokens."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        pad_token_id=0,
        eos_token_id=2,
        disable_compile=True,
    )


def prompt_rows(rows: int = 8, length: int = 40) -> dict:
    """One prompt repeated `rows` times, as TRL repeats each of a step's prompts group_size times.

    40 tokens: SmolLM2's chat template around compare_trl's "What is x + y? Reply with just the number."
    """
    ids = torch.randint(3, 49152, (1, length), generator=torch.Generator().manual_seed(1)).repeat(rows, 1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def time_sampling(model, rows: int = 8, new_tokens: int = 32) -> dict:
    """One GRPO sampling call as the grpo kind's trainer makes it: seconds of the whole call and of each decoding
    step (between consecutive decoder calls, the first of which is the prompt's last token)."""
    from dragon_dagster.engine.train import rollout

    batch = prompt_rows(rows)
    config = generation_config(new_tokens)
    stamps = []
    embeddings = model.get_base_model().model.embed_tokens  # called once a forward by generate and by our loop
    handle = embeddings.register_forward_pre_hook(lambda *a: stamps.append(time.perf_counter()))
    try:
        record = []
        start = time.perf_counter()
        with torch.no_grad(), rollout.sampling(model, record):
            out = model.generate(**batch, generation_config=config)
        total = time.perf_counter() - start
    finally:
        handle.remove()
    new_tokens = out.shape[1] - batch["input_ids"].shape[1]  # fewer only if every row drew the end token
    # stamps: [prefill, step 1, ..., step new_tokens]; step i's time is stamp[i+1] - stamp[i] for i >= 1
    steps = [b - a for a, b in zip(stamps[1:-1], stamps[2:], strict=False)]
    return {"seconds": total, "step_seconds": statistics.median(steps) if steps else None, "new_tokens": new_tokens}


def sampling(
    runs: int = 3, rows: int = 8, new_tokens: int = 32, bandwidth_gb_s=None, peak_gflop_s=None, model=None
) -> dict:
    """GRPO sampling's weight bytes read per second, as a fraction of the bandwidth, and its FLOP/s."""
    model = model or smol_lora_model()
    weights = decode_weight_bytes(model)
    config = model.config
    time_sampling(model, rows, 4)  # warm-up
    timed = [time_sampling(model, rows, new_tokens) for _ in range(runs)]
    seconds = [t["seconds"] for t in timed]
    step_seconds = [t["step_seconds"] for t in timed]
    context = prompt_rows(rows)["input_ids"].shape[1] + new_tokens / 2
    flops_step = 2 * rows * (weights["decoder_linear_params"] + weights["head_params"])
    flops_step += attention_flops_per_step(config, rows, int(context))
    result = {
        "shape": "smol (30 layers, hidden 576, MLP 1536, 9/3 heads, vocab 49152, tied), LoRA r16 a32 all-linear",
        "rows": rows,
        "new_tokens": new_tokens,
        "threads": torch.get_num_threads(),
        **weights,
        "call_seconds": [round(s, 3) for s in seconds],
        "call_seconds_median": round(statistics.median(seconds), 3),
        "step_ms_median": round(1e3 * statistics.median(step_seconds), 2),
        "decode_tokens_per_s": round(rows * new_tokens / statistics.median(seconds), 1),
        "matmul_flops_per_step": flops_step,
        "arithmetic_intensity_flop_per_byte": round(flops_step / weights["bytes_per_step"], 2),
    }
    for name, step in (("call", statistics.median(seconds) / new_tokens), ("step", statistics.median(step_seconds))):
        result[f"{name}_weight_gb_s"] = round(weights["bytes_per_step"] / step / 1e9, 2)
        result[f"{name}_gflop_s"] = round(flops_step / step / 1e9, 1)
        if bandwidth_gb_s:
            result[f"{name}_fraction_of_bandwidth"] = round(result[f"{name}_weight_gb_s"] / bandwidth_gb_s, 3)
        if peak_gflop_s:
            result[f"{name}_fraction_of_matmul_peak"] = round(result[f"{name}_gflop_s"] / peak_gflop_s, 3)
    if bandwidth_gb_s and peak_gflop_s:
        memory_s = weights["bytes_per_step"] / (bandwidth_gb_s * 1e9)
        compute_s = flops_step / (peak_gflop_s * 1e9)
        result["ridge_flop_per_byte"] = round(peak_gflop_s / bandwidth_gb_s, 2)
        result["bound"] = "compute (matmul peak)" if compute_s > memory_s else "memory bandwidth"
        result["roofline_step_ms"] = round(1e3 * max(memory_s, compute_s), 2)
        result["step_fraction_of_roofline"] = round(max(memory_s, compute_s) / statistics.median(step_seconds), 3)
        result["call_fraction_of_roofline"] = round(
            max(memory_s, compute_s) * new_tokens / statistics.median(seconds), 3
        )
    return result


PROFILE_GROUPS = {
    "linear products": ("mkldnn::_linear_pointwise", "aten::mm", "aten::linear"),
    "fold + pack (once a call)": ("mkldnn::_reorder_linear_weight", "aten::addmm"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
    "cat (KV cache, rotary, generate's ids and mask)": ("aten::cat",),
    "sampling (softmax, running sum, draw)": (
        "aten::_softmax",
        "aten::cumsum",
        "aten::searchsorted",
        "aten::uniform_",
        "aten::log",
        "aten::gather",
        "aten::isin",
    ),
}


def profile_sampling(model=None, rows: int = 8, new_tokens: int = 32) -> dict:
    """Where one sampling call's time goes, by torch.profiler's self time of its ops (ms per decoding step):
    PROFILE_GROUPS, the other ops (norms, rotary, activations, copies), and the rest of the wall time, which is
    Python: HF generate's loop, the modules' calls, and the ops' dispatch (inflated by the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    model = model or smol_lora_model()
    time_sampling(model, rows, 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = time_sampling(model, rows, new_tokens)["seconds"]
    groups = dict.fromkeys([*PROFILE_GROUPS, "other ops"], 0.0)
    for event in prof.key_averages():
        name = next((g for g, ops in PROFILE_GROUPS.items() if event.key in ops), "other ops")
        groups[name] += event.self_cpu_time_total / 1e3
    groups["python and dispatch (wall - ops)"] = 1e3 * wall - sum(groups.values())
    return {
        "wall_s": round(wall, 3),
        "threads": torch.get_num_threads(),
        "ms_per_step": {k: round(v / new_tokens, 2) for k, v in groups.items()},
        "share": {k: round(v / (1e3 * wall), 3) for k, v in groups.items()},
    }


@contextlib.contextmanager
def unfused():
    """decode_weights without the stacked q/k/v and gate/up products (the packed layers one by one, as before)."""
    from dragon_dagster.engine.infer import decode_weights

    real = decode_weights.fused_groups
    decode_weights.fused_groups = lambda model, linears: []
    try:
        yield
    finally:
        decode_weights.fused_groups = real


@contextlib.contextmanager
def generate_loop():
    """Sampling through transformers' own decoding loop (generate's _sample, each group's prompt prefilled once by
    rollout) instead of this project's (decode_loop.py)."""
    from dragon_dagster.engine.infer import decode_loop

    real = decode_loop.unsupported_model
    decode_loop.unsupported_model = lambda model: "switched off by benchmarks/limits.py"
    try:
        yield
    finally:
        decode_loop.unsupported_model = real


def interleaved(variants: dict, runs: int = 3, rows: int = 8, new_tokens: int = 32, model=None) -> dict:
    """Sampling calls of each variant (name: a function returning the context it runs in) in turn, `runs`
    rounds: the seconds of each call and of its median decoding step, with their median, min and max."""
    model = model or smol_lora_model()
    for make in variants.values():  # warm-up
        with make():
            time_sampling(model, rows, 4)
    found = {name: {"call_s": [], "step_ms": []} for name in variants}
    for _ in range(runs):
        for name, make in variants.items():
            with make():
                t = time_sampling(model, rows, new_tokens)
            found[name]["call_s"].append(round(t["seconds"], 3))
            found[name]["step_ms"].append(round(1e3 * t["step_seconds"], 1))
    for f in found.values():
        for key in ("call_s", "step_ms"):
            f[key + "_median"] = statistics.median(f[key])
            f[key + "_range"] = [min(f[key]), max(f[key])]
    return found


def sft_flops_per_token(
    seq_len: int, scored_fraction: float = 1.0, arch: str = "smol", rank: int = 16, causal: bool = True
) -> float:
    """FLOPs of one trained token of a LoRA SFT step (forward + backward), counted analytically:

    - frozen decoder linears (P params): 2P forward + 2P for the input gradients (no weight gradients);
    - LoRA adapters (r (in + out) params per linear, Q of them): 2Q forward + 2Q input + 2Q weight gradients;
    - the head (V x H, tied and frozen) over the scored positions only: 2VH forward + 2VH input gradient;
    - attention (QK and PV products, H_attn = heads x head_dim per layer): 4 H_attn S forward and twice that
      backward per token, S the context a token attends to: seq_len / 2 on average when causal.
    Norms, activations, rotary embeddings and the softmax are elementwise and left out.
    """
    from shapes import arch_config

    c = arch_config(arch, 49152)
    h, m, layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    head_dim = getattr(c, "head_dim", None) or h // c.num_attention_heads
    q_out, kv_out = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
    shapes = [(h, q_out), (h, kv_out), (h, kv_out), (q_out, h), (h, m), (h, m), (m, h)]  # in, out
    frozen = layers * sum(i * o for i, o in shapes)
    lora = layers * sum(rank * (i + o) for i, o in shapes)
    head = c.vocab_size * h
    context = seq_len / 2 if causal else seq_len
    attention = layers * 3 * 4 * q_out * context
    return 4 * frozen + 6 * lora + 4 * head * scored_fraction + attention


def sft_achieved(tokens_per_s: float, seq_len: int, scored_fraction: float = 1.0, peak_gflop_s=None, **kw) -> dict:
    """SFT's achieved GFLOP/s at a measured rate of trained tokens, and its fraction of the matmul peak."""
    flops = sft_flops_per_token(seq_len, scored_fraction, **kw)
    out = {"flops_per_token": flops, "gflop_s": round(tokens_per_s * flops / 1e9, 1)}
    if peak_gflop_s:
        out["fraction_of_matmul_peak"] = round(out["gflop_s"] / peak_gflop_s, 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--gib", type=float, default=1.0, help="array size of the bandwidth kernels")
    p.add_argument("--runs", type=int, default=3, help="sampling calls timed")
    p.add_argument("--skip-sampling", action="store_true")
    p.add_argument("--profile", action="store_true", help="also break one sampling call down by op (torch.profiler)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, all cores)")
    p.add_argument(
        "--ab-fused", action="store_true", help="also time sampling with and without fused q/k/v, gate/up, interleaved"
    )
    p.add_argument(
        "--ab-loop", action="store_true", help="also time sampling with generate's loop and with ours, interleaved"
    )
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    out["memory_bandwidth"] = memory_bandwidth(a.gib)
    out["matmul_peak"] = matmul_peak()
    if not a.skip_sampling:
        out["grpo_sampling"] = sampling(
            a.runs, bandwidth_gb_s=out["memory_bandwidth"]["read_gb_s"], peak_gflop_s=out["matmul_peak"]["gflop_s"]
        )
    if a.profile:
        out["sampling_profile"] = profile_sampling()
    for flag, name, variants in (
        (a.ab_fused, "fused_ab", {"unfused": unfused, "fused": contextlib.nullcontext}),
        (a.ab_loop, "loop_ab", {"generate": generate_loop, "decode_loop": contextlib.nullcontext}),
    ):
        if not flag:
            continue
        runs = interleaved(variants, a.runs)
        bytes_per_step = decode_weight_bytes(smol_lora_model())["bytes_per_step"]
        for r in runs.values():
            r["step_weight_gb_s_median"] = round(bytes_per_step / r["step_ms_median"] / 1e6, 2)
            r["call_weight_gb_s_median"] = round(bytes_per_step * 32 / r["call_s_median"] / 1e9, 2)
            r["step_fraction_of_bandwidth"] = round(
                r["step_weight_gb_s_median"] / out["memory_bandwidth"]["read_gb_s"], 3
            )
        out[name] = runs
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
