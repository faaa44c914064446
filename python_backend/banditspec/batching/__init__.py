"""Batch-aware serving: a server-wide speculation-length controller driven by measured
throughput (paper §6.2). See :mod:`banditspec.batching.controller`."""

from banditspec.batching.budgets import FixedGammaBudget, make_gamma_budget
from banditspec.batching.config import GammaControllerConfig
from banditspec.batching.controller import RoundRecord, ThroughputGammaController
from banditspec.batching.gamma_bandit import DiscountedGammaUCB

__all__ = [
    "DiscountedGammaUCB",
    "FixedGammaBudget",
    "GammaControllerConfig",
    "RoundRecord",
    "ThroughputGammaController",
    "make_gamma_budget",
]
