"""Bandit policies: one per module, ``select(available) -> arm`` / ``update(arm, reward)``."""
