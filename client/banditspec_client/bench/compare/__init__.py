"""``banditspec bench``: every method side by side on named workloads (paper Table 1 / Figure 3).

:mod:`.command` (the command), :mod:`.summary` (aggregation and the Markdown report),
:mod:`.plots` (PNG figures).
"""
