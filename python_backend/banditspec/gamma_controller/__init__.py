"""The server-wide speculation-length (gamma) controller, driven by measured throughput
(paper §6.2), and the budget protocol through which it caps every sequence.

* :mod:`.budget`        the protocol the decoding loop speaks (``SpeculationBudget``) and
                        its null object (``UnlimitedBudget``)
* :mod:`.budgets`       what the ``gamma_controller`` parameter selects (off | ucb | fixed:K)
* :mod:`.controller`    ``ThroughputGammaController``: the ``ucb`` budget
* :mod:`.gamma_bandit`  its learner, a discounted UCB over gamma in 0..L
* :mod:`.config`        its settings
"""

from banditspec.gamma_controller.budget import SpeculationBudget, UnlimitedBudget
from banditspec.gamma_controller.budgets import FixedGammaBudget, make_gamma_budget
from banditspec.gamma_controller.config import GammaControllerConfig
from banditspec.gamma_controller.controller import RoundRecord, ThroughputGammaController
from banditspec.gamma_controller.gamma_bandit import DiscountedGammaUCB

__all__ = [
    "DiscountedGammaUCB",
    "FixedGammaBudget",
    "GammaControllerConfig",
    "RoundRecord",
    "SpeculationBudget",
    "ThroughputGammaController",
    "UnlimitedBudget",
    "make_gamma_budget",
]
