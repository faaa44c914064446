"""BanditSpec clients and tools: the ``banditspec`` command, Triton client, benchmarks."""
