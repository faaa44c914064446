"""``banditspec soak``: hundreds of mixed requests against a real tritonserver.

Good requests (every policy, streamed or not, gRPC or HTTP, some with stop words),
cancelled streams and invalid requests run concurrently. Meanwhile the server's process
tree is sampled: resident memory per process (server, each Python stub), the target's
prefix KV cache (``nv_banditspec_target_kv_*`` gauges) and its /dev/shm regions.

It fails when a good request errs or differs from plain greedy decoding of the same
model in this process, when a cancelled stream's text is not a prefix of that output,
when an invalid request is not rejected naming its field, when acceptance of a
deterministic arm drifts between repeats of one prompt, when the KV cache exceeds its
bound, when /dev/shm or memory grows, or when stopping the server leaves a stub process
or a /dev/shm region behind.

One module per concern:

* :mod:`.workload`: the seeded mix of cases (what is sent);
* :mod:`.expected`: the expected text, plain greedy decoding of the target in this process;
* :mod:`.traffic`: sending the cases concurrently and checking every answer;
* :mod:`.processes`: the server's process tree, its memory and /dev/shm regions;
* :mod:`.sampling`: samples of memory, KV-cache gauges and /dev/shm during the run;
* :mod:`.report`: the report and its verdicts;
* :mod:`.command`: the command (start a server, soak, stop it).
"""
