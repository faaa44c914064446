"""The server-wide speculation-length (gamma) controller, driven by measured throughput
(paper §6.2), and the budget protocol through which it caps every sequence.

* :mod:`.budget`        the protocol the decoding loop speaks (``SpeculationBudget``) and
                        its null object (``UnlimitedBudget``)
* :mod:`.budgets`       what the ``gamma_controller`` parameter selects (off | ucb | fixed:K)
* :mod:`.controller`    ``ThroughputGammaController``: the ``ucb`` budget
* :mod:`.gamma_bandit`  its learner, a discounted UCB over gamma in 0..L
* :mod:`.config`        its settings

A named alternative, off by default (``gamma_controller: off``). The default controller
(``costaware``) is load-aware itself: it prices each request's draft by what its rows add
to the batched step (bandits/cost_model.py, ``BatchCost``), per request and per round, so
a request whose drafts are usually accepted keeps drafting while a poor one stops, where
one server-wide cap cuts both alike (and over costaware would only cut drafts that the
batch-aware price already found worth their rows). The cap stays for what has no price of
its own: the index policies (ucbspec, exp3spec) and fixed arms, which learn from accepted
tokens, not from cost; and ``fixed:K`` is an operator's hard ceiling (e.g. to mirror a
TensorRT-LLM ``draft_len_schedule``). ``banditspec bench-load --server-param
gamma_controller=ucb`` measures it under load against the default.
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
