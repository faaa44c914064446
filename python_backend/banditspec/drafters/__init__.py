"""Drafters: one per module, one protocol (:mod:`banditspec.drafters.base`)."""
