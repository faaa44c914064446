"""The null-object policy: no speculation.

Used with an arm set holding the single no-draft arm (index 0, γ = 0): every
step is plain target decoding, and the decoding loop needs no special case.
"""

from __future__ import annotations

from banditspec.bandits.fixed import FixedArmPolicy


class VanillaPolicy(FixedArmPolicy):
    """One arm, index 0 (the no-draft arm); ``select`` always returns 0."""

    def __init__(self) -> None:
        super().__init__(arm=0, n_arms=1)
