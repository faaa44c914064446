"""Benchmarks: every ``banditspec bench*`` command, the runners they share and one reporting stack.

Shared by the commands:

* :mod:`~banditspec_client.bench.workloads`: the named, seeded prompt lists;
* :mod:`~banditspec_client.bench.methods`: what is compared (:class:`Method`) and what one run
  records (:class:`RunRecord`);
* :mod:`~banditspec_client.bench.runner`: the one runner interface (:class:`Runner`: prompts and a
  method in, one record per prompt out) with its settings;
  :mod:`~banditspec_client.bench.in_process` (the engine in this process) and
  :mod:`~banditspec_client.bench.through_triton` (a real tritonserver, gRPC) implement it;
* :mod:`~banditspec_client.bench.report`: tables (Markdown and console) and PNG figures.

One module or package per command:

* ``banditspec bench``: :mod:`~banditspec_client.bench.compare` (methods side by side, paper Table 1);
* ``banditspec bench-overhead``: :mod:`~banditspec_client.bench.overhead`;
* ``banditspec bench-load``: :mod:`~banditspec_client.bench.concurrency` (closed-loop load sweep);
* ``banditspec bench-drafters``: :mod:`~banditspec_client.bench.drafters`;
* ``banditspec bench-engine``: :mod:`~banditspec_client.bench.engine`;
* ``scripts/bench_aiperf.sh``: :mod:`~banditspec_client.bench.aiperf`.

Server metrics (Prometheus text) are read by :mod:`banditspec_client.prometheus_text` only.
"""
