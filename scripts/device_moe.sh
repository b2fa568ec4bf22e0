#!/bin/bash
# One device call (nvidia-h100-x1 or nvidia-h200) for the mixtures of experts on the device's own
# stack (its torch and transformers): which MoE architectures train like eager
# (scripts/hf_architectures.py), the from_torch and layer-reuse tests, and the Mixtral training
# step on one GPU against eager and torch.compile (benchmarks/train_step_gpu.py). Run from the
# repository root after the wheel install line of ../shared/scripts/device-wheels.sh; writes
# $OUT/arch.txt, $OUT/frontend.txt and $OUT/bench.txt.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 RESHARD_PLAN_CACHE=off
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
(timeout 400 python3 scripts/hf_architectures.py mixtral qwen2_moe qwen3_moe olmoe granitemoe deepseek_v3 gpt_oss \
  phimoe > "$out/arch.txt" 2>&1; echo "hf_architectures exit $?" >> "$out/arch.txt") &
(timeout 450 python3 -m pytest -q -x -n 6 --dist loadfile -p no:cacheprovider tests/frontend \
  tests/extract/test_layer_reuse.py > "$out/frontend.txt" 2>&1; echo "pytest exit $?" >> "$out/frontend.txt") &
timeout 500 python3 benchmarks/train_step_gpu.py --configs mixtral-L2-h1024-s1024-b4-v32000-bf16 --graph --tp \
  > "$out/bench.txt" 2>&1
echo "train_step_gpu exit $?"
wait
tail -2 "$out/frontend.txt"
grep "|\|exit" "$out/arch.txt"
tail -6 "$out/bench.txt"
