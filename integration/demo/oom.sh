#!/bin/bash
# Asks for m_mem_free=200M (qsub -l m_mem_free=200M), then uses 400M: with geco the
# kernel stops it at the limit (OOM kill) and the demo reports how it ended.
. ./report.sh
report
echo "  allocating 400M in 50M steps ..."
python3 - <<'PY'
chunks = []
for step in range(1, 9):
    # bytes * n writes every byte, so the pages are really charged to the job
    chunks.append(b"\x01" * (50 << 20))
    print(f"  holding {step * 50}M", flush=True)
print("  allocated 400M without being stopped: no memory limit was enforced")
PY
