"""GAGAR: GRPO with grader-aware credit redistribution for code agents."""

import atexit
import gc
import os

__version__ = "0.1.0"

# torch's OpenMP threads spin while they wait for each other, and one of them descheduled by a job
# on its core stalls the rest: with one core of two busy, a kfp.local step took 140-147 s against
# 19-25 s with waiting threads asleep, which cost 0.3-1.8 s of a 13-15 s step on idle cores
# (docs/results/step-speed.md). OpenMP reads this when torch loads it, so it is set before anything imports
# torch; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A process that imported torch and transformers spends about a second of CPU at exit collecting
# objects the operating system frees anyway (a kfp.local task pays it once per stage). Freezing
# them first leaves only the module teardown; finalizers registered with atexit or weakref still run.
atexit.register(gc.freeze)
