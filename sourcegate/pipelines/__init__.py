"""sourcegate pipeline library: pure steps over Parquet paths, and the search backends."""

import os

# OpenMP threads that spin while they wait steal the cores they wait for when a night's workers
# share them; torch's bf16 encoder then ran 3x slower than fp32 instead of 2x faster (measured at
# load 6 on 2 cores, docs/benchmarks/15-embed-backends.md). Set before torch loads; the environment can override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
