"""``banditspec bench-concurrency``: throughput and latency against concurrent streams.

:mod:`.command` (the command), :mod:`.load` (closed-loop streams, server-side counters),
:mod:`.summary` (per level summaries, the Markdown tables and the figure).
"""
