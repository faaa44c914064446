"""Wall clock A/B through Triton: costaware with the EAGLE-3 head as its ``eagle`` arm against the
same with the EAGLE-1 head. One server per head (``eagle_head`` on both the controller and the
``eagle`` model: one server holds one head), both up at once, the requests sent one at a time
and interleaved per prompt (order alternating), every output compared. SmolLM2-135M fp32, the
target on 1 torch thread, 64 tokens, default settings otherwise (each head at its shipped
cut-off and probe). Prompts: each workload's prompts SKIP .. SKIP + N - 1 in the benchmark's
order. scripts/ab_eagle_head.py is the in-process one.

    .venv/bin/python scripts/ab_eagle_head_triton.py PROMPTS_PER_WORKLOAD SKIP OUT.json [WORKLOADS]
"""

import sys
from contextlib import ExitStack

from tqdm import tqdm

from banditspec.paths import cache_dir
from banditspec_client.bench.methods import RunRecord, digest, parse_methods
from banditspec_client.serve import TritonServer, free_port
from banditspec_client.triton_client import GenerationOptions, generate_grpc

from ab_common import held_out, report, row

HEADS = ("eagle3", "eagle1")
n, skip, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
workloads = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else ("code", "code-edit", "chat")
method = parse_methods("costaware")[0]
prompts = held_out(workloads, n, skip)

with ExitStack() as stack:
    servers = {head: stack.enter_context(TritonServer(
        model="smollm2", http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
        log_path=cache_dir() / f"ab-eagle-head-triton-{head}.log",
        overrides={"target": {"torch_threads": "1"}, "eagle": {"eagle_head": head},
                   "banditspec": {"eagle_head": head}})) for head in HEADS}
    options = GenerationOptions(max_tokens=64, policy=method.policy)
    for server in servers.values():  # warm-up: first calls load lazily
        generate_grpc(server.grpc_url, "Hello!", GenerationOptions(max_tokens=8, policy="fixed:eagle"))
    rows = []
    bar = tqdm(total=2 * sum(len(p) for _, p in prompts), desc="requests", unit="req")
    for workload, workload_prompts in prompts:
        for i, prompt in enumerate(workload_prompts):
            for head in (HEADS if i % 2 == 0 else HEADS[::-1]):
                result = generate_grpc(servers[head].grpc_url, prompt.text, options)
                record = RunRecord.from_stats(
                    workload=prompt.workload, kind=prompt.kind, prompt_id=prompt.prompt_id, method=head,
                    seconds=result.seconds, output_digest=digest(result.text), stats=result.stats, cpu_seconds=0.0)
                rows.append(row(workload, i, head, record))
                bar.update(1)
    bar.close()
report(rows, *HEADS, out, workloads)
