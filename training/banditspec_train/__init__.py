"""Offline work around the served models: training, evaluation and export of draft heads.

Not part of the serving package ``banditspec`` (python_backend/), which never imports it
(tests/unit/test_import_graph.py); this package imports ``banditspec`` for the heads' definitions,
the models and the prompt builder, so that what it trains is what the server runs.
"""
