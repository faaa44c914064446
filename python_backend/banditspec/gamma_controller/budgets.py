"""Speculation budgets a deployment chooses with the ``gamma_controller`` parameter:

* ``off``      no server-wide cap (each request's arms decide);
* ``fixed:K``  every sequence drafts at most K tokens per step (K = 0: plain decoding);
* ``ucb``      :class:`~banditspec.gamma_controller.controller.ThroughputGammaController`, which
               learns the cap in 0..L from measured throughput per load context.
"""

from __future__ import annotations

from banditspec.checks import check_int, is_int
from banditspec.config import MAX_SPECULATION_LENGTH
from banditspec.errors import BanditSpecValidationError
from banditspec.gamma_controller.budget import SpeculationBudget, UnlimitedBudget
from banditspec.gamma_controller.config import GammaControllerConfig
from banditspec.gamma_controller.controller import ThroughputGammaController

CONTROLLER_CHOICES = ("off", "ucb", "fixed:<K>")


class FixedGammaBudget:
    """The same cap for every sequence and every step."""

    def __init__(self, cap: int):
        if not is_int(cap) or not 0 <= cap <= MAX_SPECULATION_LENGTH:
            raise BanditSpecValidationError("gamma_controller", f"fixed cap must be in 0..{MAX_SPECULATION_LENGTH}, got {cap!r}")
        self.cap = cap

    def gamma_cap(self) -> int:
        return self.cap

    def record_step(self, gamma: int, tokens: int, seconds: float) -> None:
        return None


def make_gamma_budget(spec: str, max_gamma: int = 4) -> SpeculationBudget:
    """The budget named by ``spec`` (see the module docstring); ``max_gamma`` is L for ``ucb``."""
    text = spec.strip().lower()
    if text in ("", "off", "none"):
        return UnlimitedBudget()
    if text == "ucb":
        max_gamma = check_int("gamma_controller_max", max_gamma, 1, MAX_SPECULATION_LENGTH)
        return ThroughputGammaController(GammaControllerConfig(max_gamma=max_gamma))
    if text.startswith("fixed:"):
        try:
            cap = int(text[len("fixed:"):])
        except ValueError:
            raise BanditSpecValidationError("gamma_controller", f"fixed:<K> needs an integer K, got {spec!r}") from None
        return FixedGammaBudget(cap)
    raise BanditSpecValidationError("gamma_controller", f"unknown controller {spec!r}; choose from {', '.join(CONTROLLER_CHOICES)}")
