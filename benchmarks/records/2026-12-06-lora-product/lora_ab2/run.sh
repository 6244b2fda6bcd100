#!/bin/bash
# ours with PEFT's LoRA forward and with the accumulated product, DPO, KTO and GRPO, alone, interleaved, 3 runs each,
# from one clone of a63fadb (/tmp/hl12)
cd /tmp/hl12
for i in 1 2 3; do
  for side in peft accumulated; do
    pkill -f warm.server
    PYTHONPATH=/tmp/hl12 /work/main/.venv/bin/python benchmarks/compare_trl.py --arch smol --only dpo,kto,grpo \
      --pref-steps 5 --grpo-steps 5 --rounds 1 --skip-peer --speed lora_product=$side \
      --json /tmp/s12/lora_ab2/${side}_$i.json > /tmp/s12/lora_ab2/${side}_$i.log 2>&1
  done
done
echo done > /tmp/s12/lora_ab2/done
