"""Shared test settings.

The test models are tiny: one intra-op thread is faster for them than two, and it keeps the suite's timings
stable when the machine is shared.
"""

import torch

torch.set_num_threads(1)
