#!/usr/bin/env bash
# The GPU half of benchmarks/compare_trl.py, for a machine that cannot reach a package index.
#
#   bash benchmarks/gpu.sh prepare   # here: wheels the GPU machine lacks and the tokenizer -> .bench/
#   bash benchmarks/gpu.sh run       # there (python3 with CUDA torch, transformers, peft): explore, then the headline
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
  du -sh "$BENCH"
}

run() {
  OUT=${OUT:-$BENCH/out}
  mkdir -p "$OUT" /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$BENCH"/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.log"
  # Every step below must succeed: a failure stops the script with the failing command's output (pipefail).
  bench() { python3 benchmarks/compare_trl.py --tok "$BENCH/tok" --arch smol "$@" 2>&1 | tee -a "$OUT/gpu.log"; }
  local shape=(--steps 10 --pref-steps 8 --grpo-steps 6 --bs 16 --gen-bs 64 --comp 128)
  # 1. The peer's candidate options once each (plain TRL, no gradient checkpointing), to find its best here.
  bench --explore "${shape[@]}" --peer-timeout 300 --json "$OUT/explore.json"
  # 2. The headline: three interleaved rounds against the fastest peer options of step 1, the machine's limits,
  #    and GRPO with one sampling round per 4 steps on both sides.
  bench --rounds 3 "${shape[@]}" --peer-from "$OUT/explore.json" --limits --second-rows grpo_rounds4 \
    --json "$OUT/headline.json"
}

"${1:-run}"
