#!/bin/bash
# One device call on nvidia-h200-x2 (issue 5's acceptance run): the 2-rank NCCL check
# (correctness, collectives vs raw, end to end vs DTensor) then the one-GPU kernel check with
# its bandwidth table. Run from the repository root after the wheel install line of
# ../shared/scripts/device-wheels.sh; writes $OUT/multi.md, $OUT/check.md and their logs.
export PYTHONUNBUFFERED=1 RESHARD_KERNEL_CACHE=/tmp/kc NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpus.csv"
timeout 300 python3 scripts/gpu_multi.py --nprocs 2 --max-time 280 ${MULTI_ARGS:-} > "$out/multi.md" 2> "$out/multi.err"
echo "gpu_multi exit $?"
timeout 270 python3 scripts/gpu_check.py ${CHECK_ARGS:-} > "$out/check.md" 2> "$out/check.err"
echo "gpu_check exit $?"
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/kernels/test_gpu_local.py tests/kernels/test_kernels_compile.py \
  tests/lower/test_remap_fast.py tests/ops/test_broadcast.py tests/runtime/test_staging.py > "$out/pytest.txt" 2>&1
echo "gpu pytest exit $?: $(tail -1 "$out/pytest.txt")"
grep -A12 "^## 2\." "$out/multi.md" | cut -c1-400
grep -A8 "^| case" "$out/multi.md" | tail -6
grep -B2 -A30 "kernel bandwidth" "$out/check.md" | head -45
tail -3 "$out/check.md"
