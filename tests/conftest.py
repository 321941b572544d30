"""Suite-wide settings.

One intra-op thread for torch, here and in every subprocess a test starts (they inherit the variable):
the fault cases run in the background beside the rest of the suite on CI's two cores, and the tests'
tensors are tiny. With torch's default of a thread per core, OpenMP threads of two processes wait for
each other at every parallel region: under that contention benchmarks/capture_speed.py's test took 85 s
against 23 s on one thread, and most of that time was spent spinning.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): the variable came too late for it
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
