#!/usr/bin/env bash
# GPU checks in one run, for a GPU machine without a package index:
# the wheels agent-r1 needs beyond the machine's image are carried in .gpu-wheels (pydantic,
# omegaconf and their dependencies: `pip download` them for Python 3.12 first), agent-r1 runs
# from the source tree. Results go to $OUT (or runs/gpu-checks).
set -uo pipefail
OUT="${OUT:-runs/gpu-checks}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/agent-r1-deps .gpu-wheels/*.whl
export PYTHONPATH="/tmp/agent-r1-deps:$PWD/core:$PWD/benchmarks"
python3 - <<'PY'
import torch, transformers
from transformers.utils import is_flash_attn_2_available
print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(),
      "flash_attn_2", is_flash_attn_2_available(), flush=True)
PY
timeout "${BENCH_TIMEOUT:-420}" python3 benchmarks/bench_gpu.py --sections "${SECTIONS:-packing,sharding}" --out "$OUT/bench_gpu" 2>&1 \
  | grep -v "Loading weights\|Writing model" | tail -c 8000
cp "$OUT/bench_gpu/results.json" "$OUT/results.json" 2>/dev/null
