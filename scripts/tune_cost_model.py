#!/usr/bin/env python
"""Measure this machine and write a calibrated reshard cost profile (JSON).

Thin wrapper over ``reshard.tune`` (the same as ``reshard tune``), e.g.

    python scripts/tune_cost_model.py --nprocs 8 --out h200x8.json          # NCCL on 8 GPUs
    python scripts/tune_cost_model.py --backend gloo --nprocs 4 --sizes 1K 4M
    python scripts/tune_cost_model.py --backend nccl --nprocs 1             # device figures only

then ``reshard.optimize(fusion, cost_profile="h200x8.json")``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reshard.tune import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
