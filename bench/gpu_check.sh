#!/usr/bin/env bash
# The GPU checks in one run (one CUDA device, under 8 minutes): build rlboost's native module
# with its CUDA kernels, run the tests marked `gpu` (FSDP2 on NCCL against the CPU step, the
# weight round trip CUDA -> pinned staging -> pull -> CUDA, the embedded engine on the GPU,
# the KV page kernels, the chunked log-probs, packed sequences against padded ones and
# activation checkpointing's peak memory: tests/gpu/test_gpu_packing.py), then measure the log-probs' GPU memory and
# the transfer's GB/s. Needs torch with CUDA, nvcc, numpy, safetensors, pytest, hypothesis,
# scikit-build-core and pybind11; no network, Ray or SGLang. Wheels for missing pure-Python
# packages may be given in a folder: RLBOOST_WHEELS=/path/to/wheels bash bench/gpu_check.sh
# Ends with one summary line; exits 0 on a machine without a CUDA device ("skipped").
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${RLBOOST_GPU_CHECK_OUT:-/tmp/rlboost-gpu-check}
mkdir -p "$OUT"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: skipped: no CUDA device"
  exit 0
fi

missing=$("$PY" - <<'EOF'
import importlib.util
mods = ["numpy", "safetensors", "pytest", "hypothesis", "scikit_build_core", "pybind11"]
print(" ".join(m for m in mods if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ] && [ -n "${RLBOOST_WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --find-links "$RLBOOST_WHEELS" ${missing//_/-} || true
  missing=$("$PY" -c "import importlib.util as u; print(' '.join(m for m in '$missing'.split() if u.find_spec(m) is None))")
fi
if [ -n "$missing" ]; then
  echo "gpu_check: FAILED: missing Python packages: $missing (give their wheels with RLBOOST_WHEELS=dir)"
  exit 1
fi

status=0
note() { echo "== $* ($(date +%T))"; }

note "build with CUDA kernels (RLBOOST_WITH_CUDA=ON)"
if RLBOOST_WITH_CUDA=ON timeout 300 "$PY" -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; then
  has_cuda=$("$PY" -c "from rlboost import _C; print(_C.HAS_CUDA)")
else
  tail -30 "$OUT/build.log"
  echo "gpu_check: FAILED: the CUDA build failed (log: $OUT/build.log)"
  exit 1
fi
echo "rlboost._C.HAS_CUDA=$has_cuda"

note "tests marked gpu"
timeout 360 "$PY" -m pytest -m gpu -q -p no:cacheprovider -o addopts="--strict-markers" \
  tests/gpu tests/rollout/test_embedded_gpu.py tests/migration/test_kv_pages_gpu.py 2>&1 | tee "$OUT/tests.log"
tests_rc=${PIPESTATUS[0]}
tests_line=$(grep -E "[0-9]+ (passed|failed|error)" "$OUT/tests.log" | tail -1)
[ "$tests_rc" -eq 0 ] || status=1

note "log-prob memory on the GPU"
timeout 180 "$PY" bench/logprob_memory.py --device cuda 2>&1 | tee "$OUT/logprob.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
logprob=$("$PY" -c "import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(f\"{d['reduction_vs_naive']}x less than the upcast ({d['value']} vs {d['peers']['naive_fp32_upcast']} GB)\")" "$OUT/logprob.log" 2>/dev/null || echo "n/a")

note "weight transfer GB/s"
timeout 120 "$PY" bench/gpu_transfer.py --gib 1 2>&1 | tee "$OUT/transfer.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
transfer=$("$PY" -c "import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(f\"{d['value']} GB/s end to end (torch D2H {d['peers']['torch_d2h_pinned']}, H2D {d['peers']['torch_h2d_pinned']}), pinned staging {d['pinned_staging']}\")" "$OUT/transfer.log" 2>/dev/null || echo "n/a")

verdict=$([ "$status" -eq 0 ] && echo ok || echo FAILED)
echo "gpu_check: $verdict: HAS_CUDA=$has_cuda; tests: ${tests_line:-none}; log-probs: $logprob; transfer: $transfer"
exit $status
