"""``banditspec bench-load``: the server under closed-loop load, through Triton's streaming
gRPC and the OpenAI API.

:mod:`.command` (the command: server, sweep, report), :mod:`.load` (the asyncio load
generator and per-block statistics), :mod:`.summary` (results.md and the figures).
"""
