#!/usr/bin/env bash
# The GPU half of benchmarks/compare_trl.py, for a machine that cannot reach a package index.
#
#   bash benchmarks/gpu.sh prepare   # here: wheels the GPU machine lacks, the tokenizer, the peer script -> .bench/
#   bash benchmarks/gpu.sh run       # there (python3 with CUDA torch, transformers, peft): all measurements
#
# With this workplace's device tool: run(command="bash benchmarks/gpu.sh run", carry=[".bench"], timeout_s=570).
# Results land in $OUT (or .bench/out): gpu.log, one JSON file per measurement set.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=.bench

prepare() {
  mkdir -p "$BENCH/whl"
  # What the GPU image lacks for the engine and TRL (it has torch, transformers, peft, accelerate, pandas).
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$BENCH/whl" trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 peft==0.21.2 \
    transformers==5.24.0 huggingface-hub==1.33.0
  .venv/bin/python - <<'EOF'
from transformers import AutoTokenizer
from dragon_dagster.engine.models import embedded_model_dir
AutoTokenizer.from_pretrained(embedded_model_dir()).save_pretrained(".bench/tok")
EOF
  cp ../shared/bench/anchor_trl.py "$BENCH/anchor_trl.py"
  du -sh "$BENCH"
}

run() {
  OUT=${OUT:-$BENCH/out}
  mkdir -p "$OUT" /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$BENCH"/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.log"
  bench() { python3 benchmarks/compare_trl.py --tok "$BENCH/tok" --anchor "$BENCH/anchor_trl.py" --arch smol "$@" 2>&1 \
              | grep -v -i warn | tee -a "$OUT/gpu.log"; }
  # 1. The peer's own shapes, side by side: SFT batch 16 (unpacked and packed 16 x 1024), GRPO 64 x 128 tokens,
  #    DPO and KTO batch 16 (the peer is compare_trl.py's PEER_PREFERENCE, plain TRL).
  bench --steps 10 --bs 16 --gen-bs 64 --comp 128 --only sft,sft_packed,grpo,dpo,kto --json "$OUT/peer_shapes.json"
  # 2. Ours at the sizes the targets name: packed batch 64 x 1024 without checkpointing (where the peer runs out
  #    of memory); GRPO sampling 512 completions per round (8 per prompt) for 8 optimizer steps of 64.
  bench --steps 8 --bs 64 --only sft_packed --skip-peer --json "$OUT/sft_bs64.json" || true
  bench --steps 8 --bs 64 --only sft_packed --skip-peer --loss-kernel chunked --json "$OUT/sft_bs64_chunked.json" || true
  bench --steps 16 --gen-bs 64 --gen-rounds 8 --comp 128 --only grpo --skip-peer --json "$OUT/grpo_512.json" || true
  # 3. The CPU levers on CUDA, against its defaults: GRPO with TRL's generate (sampling=trl) instead of grouped
  #    sampling; the chunked head with the unpadded forward (unpad=on) instead of TRL's Triton head, unpacked.
  bench --steps 8 --gen-bs 64 --comp 128 --only grpo --skip-peer --speed sampling=trl --json "$OUT/grpo_trl_sampling.json" || true
  bench --steps 8 --bs 16 --only sft,dpo --skip-peer --loss-kernel chunked --speed unpad=on --speed packing=off \
    --json "$OUT/unpadded_chunked.json" || true
}

"${1:-run}"
