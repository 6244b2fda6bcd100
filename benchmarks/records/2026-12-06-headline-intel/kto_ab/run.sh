#!/bin/bash
# ours before (a0e32f4, /tmp/kb0) and after (/tmp/kb), KTO alone, interleaved, 4 runs each
for i in 1 2 3 4; do
  for side in kb0 kb; do
    pkill -f warm.server
    cd /tmp/$side && PYTHONPATH=/tmp/$side /work/main/.venv/bin/python benchmarks/compare_trl.py --arch smol --only kto --pref-steps 5 --rounds 1 --skip-peer --json /tmp/kto_ab_${side}_$i.json > /tmp/kto_ab_${side}_$i.log 2>&1
  done
done
echo done > /tmp/kto_ab.done
