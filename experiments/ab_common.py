"""What the A/B scripts share: one row per request, and the summary they print and save.

Each script runs two settings of costaware on the same prompts, interleaved per prompt
(order alternating); a row holds (workload, prompt, setting, tokens, seconds, decode
seconds, ms outside the target over the decode steps, decode steps, output digest).
"""

import json
from collections.abc import Callable, Iterable, Sequence

COLUMNS = ["workload", "prompt", "method", "tokens", "seconds", "decode_seconds", "rest_of_steps_ms", "decode_steps",
           "digest"]
WORKLOADS = ("code", "code-edit", "chat", "mixed")


def held_out(workloads: Iterable[str], n: int, skip: int) -> list:
    """(workload, its prompts SKIP .. SKIP + N - 1 of the tune split, in the benchmark's order) for
    each workload: an A/B run decides a default, so it tunes, and the heldout split stays unseen."""
    from banditspec_client.bench.workloads import load_workload

    out = [(w, load_workload(w, skip + n, split="tune")[skip:]) for w in workloads]
    short = [f"{w} ({len(p)})" for w, p in out if len(p) < n]
    if short:
        raise SystemExit(f"the tune split has fewer than {skip + n} prompts in: {', '.join(short)}")
    return out


def tokens_per_second(rows: list, method: str, workload: str = "all", decode: bool = False) -> float:
    """``method``'s tokens per second over its rows of ``workload`` ("all": every workload),
    counting the whole request or (``decode``) its decode steps only."""
    rs = [r for r in rows if r[2] == method and workload in ("all", r[0])]
    return sum(r[3] for r in rs) / sum(r[5 if decode else 4] for r in rs)


def triton_runner(methods: Sequence, parameters: Callable[[object], dict], models: dict | None = None):
    """A TritonRunner class that serves each method from its own copy of the controller model
    (its own cost model and server-wide statistics) with ``parameters(method)`` set on it, and
    ``models`` ({model name: parameters}) set on the server's other models."""
    from banditspec_client.bench import through_triton
    from banditspec_server import serve

    class Runner(through_triton.TritonRunner):
        def __enter__(self):
            original = serve.TritonServer

            def server(**kwargs):
                for method in methods:
                    kwargs["overrides"][through_triton.private_model_name(method)].update(parameters(method))
                for model, values in (models or {}).items():
                    kwargs["overrides"].setdefault(model, {}).update(values)
                return original(**kwargs)

            serve.TritonServer = server
            try:
                return super().__enter__()
            finally:
                serve.TritonServer = original

    return Runner


def row(workload: str, prompt: int, setting: str, record) -> tuple:
    """A RunRecord as a row (its first step, the prompt's prefill, left out of the decode figures)."""
    rest = [s - v for s, v in zip(record.step_ms[1:], record.verify_ms[1:])]
    return (workload, prompt, setting, record.generated_tokens, record.seconds, sum(record.step_ms[1:]) / 1000,
            sum(rest), len(rest), record.output_digest)


def interleaved(prompts: Iterable[tuple[str, Sequence]], methods: Sequence, run: Callable, bar=None) -> list:
    """Rows of ``run(prompt, method)`` (a RunRecord) for each (workload, its prompts) in
    ``prompts``, the methods interleaved per prompt, their order alternating (so that a
    drift of the machine's speed falls on both alike); ``bar``: a tqdm bar to advance."""
    rows = []
    for workload, workload_prompts in prompts:
        for i, prompt in enumerate(workload_prompts):
            for method in (methods if i % 2 == 0 else methods[::-1]):
                rows.append(row(workload, i, method.name, run(prompt, method)))
                if bar is not None:
                    bar.update()
    return rows


def report(rows: list, first: str, second: str, out: str, workloads: tuple[str, ...] = WORKLOADS) -> None:
    """Writes the rows to ``out`` (JSON) and prints, per workload and pooled, tokens/s of
    ``first`` over ``second`` (overall and decode only), their ms outside the target per
    step, and whether every prompt's outputs were identical."""
    with open(out, "w") as f:
        json.dump({"columns": COLUMNS, "rows": rows}, f)
    for w in (*workloads, "all"):
        agg = {}
        if not any(w == "all" or r[0] == w for r in rows):
            continue  # a workload the script did not run
        for m in (first, second):
            rs = [r for r in rows if (w == "all" or r[0] == w) and r[2] == m]
            agg[m] = (tokens_per_second(rows, m, w), sum(r[6] for r in rs) / sum(r[7] for r in rs),
                      tokens_per_second(rows, m, w, decode=True))
        same = all(len({r[8] for r in rows if r[0] == ww and r[1] == i}) == 1 for ww, i in {(r[0], r[1]) for r in rows})
        print(f"{w:10s} {first}/{second} tokens/s {agg[first][0] / agg[second][0]:.3f}  decode "
              f"{agg[first][2] / agg[second][2]:.3f}  rest ms/step {agg[first][1]:.2f} vs {agg[second][1]:.2f}  "
              f"identical {same}")
