#!/usr/bin/env bash
# The deep test profiles that CI's `python -m pytest` leaves out (hours on a 2-core box):
#   - tests/fuzz/test_fuzz.py with RESHARD_FUZZ_PROFILE=deep: 5000 random (not derandomized) programs
#     per fuzz test, hypothesis' example database keeping the failures it finds;
#   - tests/fuzz/test_train_fuzz.py likewise: 1000 random programs and 300 data-parallel steps made
#     training steps, five plans of each checked;
#   - tests/search/test_segments.py's segmented-saturation fuzz with RESHARD_SEGMENT_FUZZ_EXAMPLES (300);
#   - tests/rules/test_resharding.py's and test_propagation.py's rule sweeps scaled by RESHARD_SWEEP_SCALE (10x).
# Usage: scripts/deep_fuzz.sh [pytest arguments], e.g. scripts/deep_fuzz.sh -x -k optimized_plan
# Each count can be set from the environment (RESHARD_FUZZ_EXAMPLES overrides the deep profile's).
set -euo pipefail
cd "$(dirname "$0")/.."
export RESHARD_FUZZ_PROFILE=deep
export RESHARD_SEGMENT_FUZZ_EXAMPLES="${RESHARD_SEGMENT_FUZZ_EXAMPLES:-300}"
export RESHARD_SWEEP_SCALE="${RESHARD_SWEEP_SCALE:-10}"
exec python -m pytest -q tests/fuzz/test_fuzz.py tests/fuzz/test_train_fuzz.py tests/search/test_segments.py tests/rules/test_resharding.py tests/rules/test_propagation.py --durations=10 "$@"
