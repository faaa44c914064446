"""Aggregation of benchmark runs (pure functions) and the Markdown report.

Definitions (per workload, over the prompts every compared method finished):

* tokens/s: pooled, sum of generated tokens / sum of request seconds;
* MAT (mean accepted tokens): pooled, sum of generated tokens / sum of target calls;
* speedup: tokens/s of the method / tokens/s of ``vanilla`` (plain decoding);
* best fixed arm: the fixed-arm method (pld, suffix, rest, eagle, copy) with the highest tokens/s;
  ``banditspec bench`` runs the fixed arm of every drafter the adaptive methods may choose, so
  the best fixed arm is chosen among all of them;
* oracle: per prompt, the fixed-arm method that was fastest on *that* prompt; its
  tokens/s is pooled over the prompts like any method's. ``vs oracle`` = method / oracle;
* lossless: under greedy decoding every method must produce vanilla's exact output (sampled
  runs are not compared token by token: speculative sampling keeps the target's distribution,
  not its draw for a given seed);
* interval (adaptive methods): a paired bootstrap over the prompts of ``vs best fixed``,
  the best fixed arm re-chosen in every resample as the table chooses it; its central 90 %
  says how far the prompts alone could move the ratio (on this CPU about +-3.5 % at 24
  prompts per workload, +-5-7 % at 12).

Every rate exists for three clocks: ``wall`` (request wall time, what a user sees);
``cpu`` (CPU time the serving processes spent on the request: on a machine shared with
other load it moves far less than wall time, so it is the steadier comparison); and
``decode`` (the request's steps after the first, from its speculation stats: the first
step prefills the prompt, the same work for every method and on this CPU often 40 % of a
64-token request, so leaving it out shows the part the method decides, with less noise).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from banditspec.config import arm_drafter

from banditspec_client.bench.methods import ADAPTIVE_POLICIES, FIXED_DRAFTERS, VANILLA, RunRecord
from banditspec_client.bench.report import MISSING, fmt
from banditspec_client.bench.report import markdown_table as table


def is_fixed_arm(method: str) -> bool:
    return arm_drafter(method) in FIXED_DRAFTERS


def is_adaptive(method: str) -> bool:
    return method.partition(":")[0] in ADAPTIVE_POLICIES


@dataclass
class MethodSummary:
    method: str
    prompts: int
    tokens: int
    seconds: float
    steps: int
    mean_prompt_speedup: float | None = None  # mean over prompts of per-prompt speedup
    prompts_won: int = 0  # prompts on which it was the fastest method overall
    speedup: float | None = None
    vs_best_fixed: float | None = None
    vs_oracle: float | None = None
    vs_best_fixed_interval: tuple[float, float] | None = None  # adaptive methods: see best_fixed_interval

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


@dataclass
class WorkloadSummary:
    workload: str
    methods: list[MethodSummary]
    prompt_ids: list[str]
    clock: str = "wall"
    best_fixed: str | None = None
    oracle_tokens_per_second: float | None = None
    oracle_choices: dict[str, int] = field(default_factory=dict)  # fixed arm -> prompts it was best on
    lossless_mismatches: list[tuple[str, str]] = field(default_factory=list)  # (prompt, method)
    greedy: bool = True  # False: sampled, outputs not compared with vanilla's

    def get(self, method: str) -> MethodSummary | None:
        return next((m for m in self.methods if m.method == method), None)


def by_prompt(records: Iterable[RunRecord]) -> dict[str, dict[str, RunRecord]]:
    """{prompt_id: {method: record}} in first-seen prompt order."""
    out: dict[str, dict[str, RunRecord]] = {}
    for r in records:
        out.setdefault(r.prompt_id, {})[r.method] = r
    return out


CLOCKS = ("wall", "cpu", "decode")


def run_seconds(record: RunRecord, clock: str = "wall") -> float:
    """The request's wall seconds, its CPU seconds (``clock="cpu"``), or the seconds of its
    steps after the first (``clock="decode"``); 0 when not measured."""
    if clock == "wall":
        return record.seconds
    if clock == "cpu":
        return record.cpu_seconds or 0.0
    return sum(record.step_ms[1:]) / 1000.0


def run_tokens(record: RunRecord, clock: str = "wall") -> int:
    """Tokens the clock's seconds produced: all of them, or (``decode``) those after the
    first step's (its accepted draft tokens and the target's own)."""
    if clock != "decode":
        return record.generated_tokens
    first = record.accepted[0] + 1 if record.accepted else record.generated_tokens
    return max(0, record.generated_tokens - first)


def run_rate(record: RunRecord, clock: str = "wall") -> float:
    """Tokens per second of one run, by ``clock``."""
    seconds = run_seconds(record, clock)
    return run_tokens(record, clock) / seconds if seconds > 0 else 0.0


def oracle_per_prompt(runs: dict[str, RunRecord], clock: str = "wall") -> str | None:
    """The fixed-arm method with the highest tokens/s among one prompt's runs."""
    fixed = [r for m, r in runs.items() if is_fixed_arm(m)]
    return max(fixed, key=lambda r: run_rate(r, clock)).method if fixed else None


INTERVAL_LEVEL, INTERVAL_RESAMPLES = 0.90, 2000


def best_fixed_interval(prompts: dict[str, dict[str, RunRecord]], method: str, fixed: Sequence[str],
                        clock: str = "wall", *, level: float = INTERVAL_LEVEL, resamples: int = INTERVAL_RESAMPLES,
                        seed: int = 0) -> tuple[float, float] | None:
    """The central ``level`` interval of ``method``'s tokens/s over the best fixed arm's,
    by a paired bootstrap over the prompts ({prompt: {method: record}}): each resample draws
    as many prompts with replacement, pools every method's tokens and seconds over them and
    takes the best of ``fixed`` anew. Seeded: the same runs give the same interval. None
    with fewer than two prompts or no fixed arm."""
    ids = list(prompts)
    if len(ids) < 2 or not fixed:
        return None
    columns = [method, *fixed]
    tokens = {pid: [run_tokens(prompts[pid][m], clock) for m in columns] for pid in ids}
    seconds = {pid: [run_seconds(prompts[pid][m], clock) for m in columns] for pid in ids}
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        pooled_tokens, pooled_seconds = [0] * len(columns), [0.0] * len(columns)
        for pid in rng.choices(ids, k=len(ids)):
            for j in range(len(columns)):
                pooled_tokens[j] += tokens[pid][j]
                pooled_seconds[j] += seconds[pid][j]
        rates = [t / s if s > 0 else 0.0 for t, s in zip(pooled_tokens, pooled_seconds)]
        if max(rates[1:]) > 0:
            ratios.append(rates[0] / max(rates[1:]))
    if not ratios:
        return None
    ratios.sort()
    tail = (1.0 - level) / 2.0
    return ratios[int(tail * (len(ratios) - 1))], ratios[int((1.0 - tail) * (len(ratios) - 1))]


def summarize_workload(workload: str, records: Sequence[RunRecord], methods: Sequence[str],
                       clock: str = "wall", *, greedy: bool = True) -> WorkloadSummary:
    """One workload's table; only prompts on which every method in ``methods`` ran count.
    ``clock``: "wall" (request wall time) or "cpu" (CPU time of the serving processes);
    ``greedy``: False for sampled runs (no output comparison with vanilla)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}")
    prompts = {pid: runs for pid, runs in by_prompt(r for r in records if r.workload == workload).items()
               if all(m in runs for m in methods)}
    totals = {m: MethodSummary(m, len(prompts), 0, 0.0, 0) for m in methods}
    speedups: dict[str, list[float]] = defaultdict(list)
    oracle_tokens, oracle_seconds, mismatches = 0, 0.0, []
    choices: Counter[str] = Counter()
    for pid, runs in prompts.items():
        for m in methods:
            r = runs[m]
            totals[m].tokens += run_tokens(r, clock)
            totals[m].seconds += run_seconds(r, clock)
            totals[m].steps += r.steps - (1 if clock == "decode" and r.steps else 0)
            if VANILLA in runs and run_rate(runs[VANILLA], clock) > 0:
                speedups[m].append(run_rate(r, clock) / run_rate(runs[VANILLA], clock))
            if greedy and VANILLA in runs and r.output_digest != runs[VANILLA].output_digest:
                mismatches.append((pid, m))
        winner = max(methods, key=lambda m: run_rate(runs[m], clock))
        totals[winner].prompts_won += 1
        best = oracle_per_prompt({m: runs[m] for m in methods}, clock)
        if best is not None:
            choices[best] += 1
            oracle_tokens += run_tokens(runs[best], clock)
            oracle_seconds += run_seconds(runs[best], clock)
    summary = WorkloadSummary(workload, [totals[m] for m in methods], list(prompts), clock=clock,
                              lossless_mismatches=mismatches, greedy=greedy)
    vanilla = totals.get(VANILLA)
    fixed = [totals[m] for m in methods if is_fixed_arm(m)]
    if fixed and prompts:
        summary.best_fixed = max(fixed, key=lambda s: s.tokens_per_second).method
        summary.oracle_tokens_per_second = oracle_tokens / oracle_seconds if oracle_seconds > 0 else 0.0
        summary.oracle_choices = dict(choices.most_common())
    for s in summary.methods:
        if speedups[s.method]:
            s.mean_prompt_speedup = sum(speedups[s.method]) / len(speedups[s.method])
        if vanilla is not None and vanilla.tokens_per_second > 0:
            s.speedup = s.tokens_per_second / vanilla.tokens_per_second
        if summary.best_fixed is not None:
            best_rate = totals[summary.best_fixed].tokens_per_second
            s.vs_best_fixed = s.tokens_per_second / best_rate if best_rate > 0 else None
        if summary.oracle_tokens_per_second:
            s.vs_oracle = s.tokens_per_second / summary.oracle_tokens_per_second
        if is_adaptive(s.method) and summary.best_fixed is not None:
            s.vs_best_fixed_interval = best_fixed_interval(prompts, s.method, [f.method for f in fixed], clock)
    return summary


def summarize(records: Sequence[RunRecord], methods: Sequence[str], clock: str = "wall", *,
              greedy: bool = True) -> list[WorkloadSummary]:
    workloads = list(dict.fromkeys(r.workload for r in records))
    return [summarize_workload(w, records, methods, clock, greedy=greedy) for w in workloads]


# -- targets ---------------------------------------------------------------------------
# the goals: >= plain decoding and >= the best fixed arm everywhere, +5 % on mixed,
# >= 95 % of the per-prompt oracle
MIXED_MARGIN, PER_WORKLOAD_SHARE, ORACLE_SHARE = 1.05, 1.00, 0.95


def target_checks(summaries: Sequence[WorkloadSummary],
                  policy: str = "ucbspec") -> list[tuple[str, float | None, bool | None]]:
    """(target, measured ratio, met) for the issue's targets, for ``policy``'s method."""
    out: list[tuple[str, float | None, bool | None]] = []
    for s in summaries:
        m = s.get(policy)
        if m is None:
            continue
        if m.speedup is not None:
            out.append((f"{policy} >= 1.00 x plain decoding on {s.workload}", m.speedup, m.speedup >= 1.0))
        if s.workload == "mixed":
            out.append((f"{policy} >= {MIXED_MARGIN:.2f} x best fixed arm on mixed", m.vs_best_fixed,
                        None if m.vs_best_fixed is None else m.vs_best_fixed >= MIXED_MARGIN))
        out.append((f"{policy} >= {PER_WORKLOAD_SHARE:.2f} x best fixed arm on {s.workload}", m.vs_best_fixed,
                    None if m.vs_best_fixed is None else m.vs_best_fixed >= PER_WORKLOAD_SHARE))
        out.append((f"{policy} >= {ORACLE_SHARE:.2f} x per-prompt oracle on {s.workload}", m.vs_oracle,
                    None if m.vs_oracle is None else m.vs_oracle >= ORACLE_SHARE))
    return out


# -- Markdown --------------------------------------------------------------------------
def _rate_label(clock: str) -> str:
    return {"wall": "tokens/s", "cpu": "tokens/CPU-s", "decode": "decode tokens/s"}[clock]


def markdown_table(summary: WorkloadSummary) -> str:
    header = ["method", "MAT", _rate_label(summary.clock), "speedup", "mean prompt speedup", "vs best fixed",
              "vs oracle", "prompts won"]
    rows = [
        [m.method, f"{m.mean_accepted_tokens:.2f}", f"{m.tokens_per_second:.1f}", fmt(m.speedup, "{:.2f}x"),
         fmt(m.mean_prompt_speedup, "{:.2f}x"), fmt(m.vs_best_fixed, "{:.0%}"), fmt(m.vs_oracle, "{:.0%}"),
         m.prompts_won]
        for m in summary.methods
    ]
    if summary.oracle_tokens_per_second is not None:
        rows.append(["*oracle: best fixed arm per prompt*", "", f"{summary.oracle_tokens_per_second:.1f}", "", "", "",
                     "100%", ""])
    lines = [table(header, rows, "lrrrrrrr")]
    if summary.oracle_tokens_per_second is not None:
        picks = ", ".join(f"{k} on {v}" for k, v in summary.oracle_choices.items())
        lines += ["", f"Oracle's arm per prompt: {picks}."]
    for m in summary.methods:
        if m.vs_best_fixed_interval is not None and m.vs_best_fixed is not None:
            lo, hi = m.vs_best_fixed_interval
            lines += ["", f"{m.method} / best fixed arm: {m.vs_best_fixed:.1%}; {INTERVAL_LEVEL:.0%} interval over the "
                          f"prompts [{lo:.1%}, {hi:.1%}] (paired bootstrap, {INTERVAL_RESAMPLES} resamples, the best "
                          f"arm re-chosen in each)."]
    return "\n".join(lines)


def per_prompt_table(summary: WorkloadSummary, records: Sequence[RunRecord]) -> str:
    """Per prompt: the oracle's arm and rate, and each adaptive method's share of it."""
    clock = summary.clock
    runs_by_prompt = by_prompt(r for r in records if r.workload == summary.workload)
    adaptive = [m.method for m in summary.methods if is_adaptive(m.method)]
    unit = _rate_label(clock)
    header = ["prompt", "kind", "tokens", f"vanilla {unit}", "oracle arm", f"oracle {unit}",
              *(f"{m} (% of oracle)" for m in adaptive)]
    rows = []
    for pid in summary.prompt_ids:
        runs = runs_by_prompt[pid]
        best = oracle_per_prompt({m.method: runs[m.method] for m in summary.methods}, clock)
        if best is None:
            continue
        oracle = run_rate(runs[best], clock)
        any_run = next(iter(runs.values()))
        vanilla = f"{run_rate(runs[VANILLA], clock):.1f}" if VANILLA in runs else MISSING
        shares = [f"{run_rate(runs[m], clock) / oracle:.0%}" if oracle > 0 else MISSING for m in adaptive]
        rows.append([pid, any_run.kind, any_run.generated_tokens, vanilla, best, f"{oracle:.1f}", *shares])
    return table(header, rows, "llrrlr" + "r" * len(adaptive))


def targets_table(summaries: Sequence[WorkloadSummary]) -> list[str]:
    adaptive = list(dict.fromkeys(m.method for s in summaries for m in s.methods if is_adaptive(m.method)))
    checks = [c for policy in adaptive for c in target_checks(summaries, policy)]
    if not checks:
        return []
    rows = [[t, fmt(v, "{:.1%}"), MISSING if ok is None else ("yes" if ok else "NO")] for t, v, ok in checks]
    return [table([f"target ({_rate_label(summaries[0].clock)})", "measured", "met"], rows, "lrl"), ""]


def markdown_report(summaries: Sequence[WorkloadSummary], *, title: str, command: str, setup: dict,
                    skipped: dict[str, str], records: Sequence[RunRecord] | None = None,
                    cpu_summaries: Sequence[WorkloadSummary] | None = None,
                    decode_summaries: Sequence[WorkloadSummary] | None = None) -> str:
    """The report: per workload the wall-clock table (and the CPU-time and decode-time
    tables when given), the losslessness check, the per-prompt oracle; then the targets."""
    parts = [f"# {title}", "", f"Command: `{command}`", ""]
    parts += [f"- {k}: {v}" for k, v in setup.items()]
    for name, reason in skipped.items():
        parts.append(f"- skipped method `{name}`: {reason}")
    parts.append("")
    cpu_by_workload = {s.workload: s for s in cpu_summaries or ()}
    decode_by_workload = {s.workload: s for s in decode_summaries or ()}
    for s in summaries:
        among = ", ".join(m.method for m in s.methods if is_fixed_arm(m.method)) or MISSING
        parts += [f"## {s.workload} ({len(s.prompt_ids)} prompts, best fixed arm: {s.best_fixed or MISSING}, "
                  f"among {among})", "", markdown_table(s), ""]
        if not s.greedy:
            parts += ["Sampled: outputs are not compared token by token with vanilla's (speculative sampling keeps "
                      "the target's distribution, not its draw for a seed).", ""]
        elif s.lossless_mismatches:
            shown = ", ".join(f"{m} on {p}" for p, m in s.lossless_mismatches[:5])
            parts += [f"**Output differs from vanilla** ({len(s.lossless_mismatches)} runs): {shown}", ""]
        elif s.get(VANILLA) is not None:
            parts += ["Lossless: every method's output equals vanilla's on every prompt.", ""]
        cpu = cpu_by_workload.get(s.workload)
        if cpu is not None:
            parts += [f"By CPU time (best fixed arm: {cpu.best_fixed or MISSING}):", "", markdown_table(cpu), ""]
        decode = decode_by_workload.get(s.workload)
        if decode is not None:
            parts += [f"Decode only, each request's first step (the prompt's prefill) left out (best fixed arm: "
                      f"{decode.best_fixed or MISSING}):", "", markdown_table(decode), ""]
        if records is not None:
            parts += ["<details><summary>per prompt</summary>", "", per_prompt_table(s, records), ""]
            if cpu is not None:
                parts += [per_prompt_table(cpu, records), ""]
            parts += ["</details>", ""]
    wall_targets = targets_table(summaries)
    if wall_targets:
        parts += ["## Targets", ""] + wall_targets
        if cpu_summaries:
            parts += targets_table(cpu_summaries)
        if decode_summaries:
            parts += targets_table(decode_summaries)
    return "\n".join(parts)


def summary_dict(summary: WorkloadSummary) -> dict:
    return {
        "workload": summary.workload,
        "clock": summary.clock,
        "greedy": summary.greedy,
        "prompts": summary.prompt_ids,
        "best_fixed": summary.best_fixed,
        "oracle_tokens_per_second": summary.oracle_tokens_per_second,
        "oracle_choices": summary.oracle_choices,
        "lossless_mismatches": [list(x) for x in summary.lossless_mismatches],
        "methods": [
            {
                "method": m.method, "prompts": m.prompts, "tokens": m.tokens, "seconds": round(m.seconds, 4),
                "steps": m.steps, "tokens_per_second": round(m.tokens_per_second, 3),
                "mean_accepted_tokens": round(m.mean_accepted_tokens, 4), "speedup": m.speedup,
                "mean_prompt_speedup": m.mean_prompt_speedup, "vs_best_fixed": m.vs_best_fixed,
                "vs_oracle": m.vs_oracle, "prompts_won": m.prompts_won,
                "vs_best_fixed_interval": None if m.vs_best_fixed_interval is None else list(m.vs_best_fixed_interval),
            }
            for m in summary.methods
        ],
    }
