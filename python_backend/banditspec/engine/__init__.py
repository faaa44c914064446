"""Target engines behind the verify contract (see :mod:`banditspec.engine.contract`)."""
