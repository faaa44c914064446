"""``banditspec replay``: score every policy offline, exactly, over hundreds of prompts.

1. Record (once, cached under the cache folder): for each prompt the target's greedy
   output (batched plain decoding on the reference engine) and, at every position, each
   cheap drafter's proposal (:mod:`banditspec.evaluation.replay`).
2. Replay, per cost model of the platform and per workload: plain decoding, every fixed
   arm at every gamma, the per-prompt oracle (best fixed arm per prompt in hindsight),
   the per-step oracle (best choice at every step), ucbspec, exp3spec and costaware (and
   ``costaware/k-only``: the same controller pricing rounds by k alone, without context, and
   ``costaware/rate``: maximising the long-run rate instead of each round's tokens per second).
   Time comes from the cost model: ``steep`` (the CPU engine before its fast kernels),
   ``flat`` (a GPU-like curve), ``measured`` (``bench-engine``'s fast-kernel curve at one
   context), ``surface`` (``bench-engine --contexts``: verify cost by k AND context, the
   fast kernels' real shape) or a JSON file with a list of ratios.

Prompts: the project's workloads (``--workloads``) from one content-disjoint split
(``--split tune|heldout``, recorded in ``banditspec_client/bench/splits.json``), or a user's own
JSONL file of ``{"kind": ..., "prompt": ...}`` lines (``--prompts-file``). ``multiturn``:
conversations, each turn a prompt holding the whole history with the target's OWN greedy answers
to the earlier turns (rows per turn index). Outputs a table (markdown), JSON and a PNG into ``--out``.

Greedy only: a trace holds the target's greedy output and the drafters' proposals along it, so a
replay is exact for greedy decoding. Sampled decoding would need the target's distributions and
the sampler's draws at every step; ``--temperature`` above 0 is refused rather than approximated
(``banditspec bench --temperature T`` measures sampled decoding for real).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from banditspec.config import DEFAULT_MAX_DRAFT_LEN
from banditspec.errors import BanditSpecValidationError
from banditspec.serving.runtime import DEFAULT_ARMS

from banditspec_client.bench.splits import SPLITS, describe
from banditspec_client.bench.workloads import MULTITURN, MULTITURN_TURNS

if TYPE_CHECKING:
    from banditspec.bandits.cost_model import CostModel
    from banditspec.engine.reference import ReferenceEngine
    from banditspec.evaluation.replay import Trace

STEEP = [1.00, 1.54, 1.77, 1.79, 1.98, 2.10, 2.21, 2.26, 2.31]  # the fp32 engine before fast kernels
FLAT = [1.00, 1.02, 1.04, 1.06, 1.08, 1.10, 1.12, 1.14, 1.16]  # GPU-like
ENGINE_JSON = Path("docs/benchmarks/engine/engine_cost.json")
SURFACE_JSON = Path("docs/benchmarks/engine/engine_surface.json")  # bench-engine --contexts
ADAPTIVE = ("costaware", "ucbspec", "exp3spec")
K_ONLY = "costaware/k-only"  # costaware pricing rounds by k alone (no context): what context pricing adds
RATE = "costaware/rate"  # costaware maximising E - rate * C (its objective "rate") instead of each round's E / C
COSTLY = ("eagle",)  # drafters that propose only when chosen (bandit feedback, a cost per call)
# Eagle's cost per call (its catch-up included) and per drafted token, in one-token verifies:
# the live cost model's draft_costs after costaware ran 18 prompts in process (6 chat, 6 code,
# 6 code-edit; 2026-12-02, int8 head with the fused step): 4.1 ms a call + 3.4 ms a drafted
# token against a 68.5 ms one-token round (at ~190 cached tokens, overhead included).
EAGLE_COST = "0.06,0.05"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", default="code,code-edit,chat",
                        help="comma-separated (mixed = all interleaved); or multiturn alone (conversations)")
    parser.add_argument("--prompts", type=int, default=60, help="prompts per workload (multiturn: conversations)")
    parser.add_argument("--split", default="tune", choices=SPLITS,
                        help="the content-disjoint split the prompts come from (banditspec_client/bench/splits.json): "
                             "tune to tune on, heldout to check")
    parser.add_argument("--turns", type=int, default=MULTITURN_TURNS, help="multiturn: user turns per conversation")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="only 0 (greedy): a replay is exact for greedy decoding; sampled runs are refused")
    parser.add_argument("--skip", type=int, default=0,
                        help="leave out each workload's first SKIP prompts of the split")
    parser.add_argument("--prompts-file", type=Path, default=None, help='JSONL of {"kind", "prompt"} (your traffic)')
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-draft-len", type=int, default=DEFAULT_MAX_DRAFT_LEN, help="L of the replayed policies")
    parser.add_argument("--record-len", type=int, default=8, help="tokens recorded per proposal (>= L)")
    parser.add_argument("--drafters", default=",".join(DEFAULT_ARMS),
                        help="drafters to record and replay (default: every arm the server's default may use, so the "
                             "best fixed arm is chosen among all of them); eagle (costly: proposes only when chosen) "
                             "is recorded from the target's states at every position, once, beside the cheap ones")
    parser.add_argument("--eagle-cost", default=EAGLE_COST,
                        help="Eagle's drafting cost as CALL,TOKEN[,PREVIEW] in units of a one-token verify "
                             "(default: int8 head, measured in costaware's loop: 4.1 ms a call + 3.4 ms a drafted "
                             "token against a 68.5 ms round); a PREVIEW cost replays Eagle with previews on "
                             "(every round)")
    parser.add_argument("--costs", default="steep,flat,measured,surface",
                        help="cost models: steep, flat, measured, surface (by k and context), or FILE.json")
    parser.add_argument("--surface", type=Path, default=SURFACE_JSON,
                        help="the verify-cost surface of the `surface` cost model (bench-engine --contexts ... --out; "
                             "measure k up to L + 1 to replay a larger L)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per forward while recording")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/replay"))
    parser.add_argument("--wallclock", type=int, default=0, metavar="N",
                        help="also decode the first N prompts per workload for real (in process) and compare "
                             "the replay's predicted tokens/s with the measured ones")
    parser.add_argument("--wallclock-methods", default="vanilla,costaware,fixed:pld@{L},fixed:suffix@{L},fixed:rest@{L}",
                        help="methods of the wall-clock check ({L} = --max-draft-len)")


# --- prompts and recording --------------------------------------------------------------


def _prompts(args: argparse.Namespace) -> list[tuple[str, str]]:
    from banditspec_client.bench.workloads import load_prompts_file, load_workload

    if args.prompts_file is not None:
        return [(p.kind, p.text) for p in load_prompts_file(args.prompts_file)]
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    kinds = [w for w in names if w != "mixed"] or ["code", "code-edit", "chat"]
    skip = _skip(args)
    split = getattr(args, "split", "tune")
    lists = [[(p.kind, p.text) for p in load_workload(kind, skip + args.prompts, split=split)[skip:]] for kind in kinds]
    # interleaved, as a server would see mixed traffic (the statistics carry across prompts)
    return [item for group in zip(*lists) for item in group]


def _skip(args: argparse.Namespace) -> int:
    skip = getattr(args, "skip", 0)
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise BanditSpecValidationError("skip", f"must be an integer >= 0, got {skip!r}")
    return skip


def check_replay_options(args: argparse.Namespace) -> None:
    """Refuse what a replay cannot score exactly, naming the option."""
    temperature = getattr(args, "temperature", 0.0)
    if temperature != 0:
        raise BanditSpecValidationError(
            "temperature", f"replay scores greedy decoding only (got {temperature!r}): a trace holds the target's greedy "
            "output, not its distributions or the sampler's draws; measure sampled decoding with "
            "`banditspec bench --temperature T`")
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if MULTITURN in names and names != [MULTITURN]:
        raise BanditSpecValidationError("workloads", f"{MULTITURN} runs alone (conversations, not single prompts)")
    if MULTITURN in names and args.prompts_file is not None:
        raise BanditSpecValidationError("prompts_file", f"not with --workloads {MULTITURN}")


def is_multiturn(args: argparse.Namespace) -> bool:
    return args.prompts_file is None and [w.strip() for w in args.workloads.split(",") if w.strip()] == [MULTITURN]


def conversation_prompts(args: argparse.Namespace, tokenizer: Any) -> list[tuple[str, list[int], list[int]]]:
    """(kind, prompt ids, greedy output) per turn of the multiturn conversations, conversation by
    conversation (the serving order): turn k's prompt is the conversation so far with the target's
    own greedy answers (its output decoded to text, as the OpenAI API returns it) in place of the
    recorded ones; kind ``multiturn/turnK``. Cached like the traces."""
    import torch
    from banditspec.paths import cache_dir
    from banditspec.text import render_chat, text_ids

    from banditspec_client.bench.workloads import load_conversations

    skip = _skip(args)
    conversations = load_conversations(skip + args.prompts, turns=args.turns, split=args.split)[skip:]
    key = hashlib.sha256(json.dumps([args.model, args.max_tokens, [c.turns for c in conversations]]).encode()).hexdigest()[:16]
    path = cache_dir() / "traces" / f"conversations-{key}.json"
    if path.exists():
        return [(kind, ids, out) for kind, ids, out in json.loads(path.read_text())]
    from banditspec.engine.reference import ReferenceEngine

    torch.set_num_threads(max(1, args.threads))
    engine = ReferenceEngine.from_name(args.model, max_context=4096, cache_entries=max(8, args.batch))
    eos = int(tokenizer.eos_token_id)
    histories: list[list[dict]] = [[] for _ in conversations]
    per_turn: list[list[tuple[list[int], list[int]]]] = []
    for k in range(args.turns):  # all conversations' turn k in one batched pass
        prompts = []
        for history, conversation in zip(histories, conversations):
            history.append({"role": "user", "content": conversation.turns[k]})
            prompts.append(text_ids(tokenizer, render_chat(tokenizer, history)))
        with torch.inference_mode():
            outputs = _greedy_batched(engine, prompts, args.max_tokens, args.batch)
        for history, output in zip(histories, outputs):
            answer = output[:-1] if output and output[-1] == eos else output
            history.append({"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)})
        per_turn.append(list(zip(prompts, outputs)))
    rows = [(f"{MULTITURN}/turn{k + 1}", *per_turn[k][c]) for c in range(len(conversations)) for k in range(args.turns)]
    _write_lines(path, [json.dumps(rows)])
    return [(kind, list(ids), list(out)) for kind, ids, out in rows]


def _greedy_batched(engine: ReferenceEngine, prompts: list[list[int]], max_tokens: int, batch: int) -> list[list[int]]:
    """Greedy outputs, ``batch`` prompts per forward: prompts left-padded, one KV cache per
    batch grown in place (the engine's fast decoder, no prefix cache), so a step over 16
    sequences costs little more than over one. Rounding may differ from solo decoding
    where two logits tie; the replay only needs a faithful sample of the target's output."""
    import torch
    from tqdm import tqdm

    fast, head, eos = engine._fast, engine._lm_head, engine.eos_id
    assert fast is not None  # the engine's default kernels ("fast"), not "transformers"
    outputs: list[list[int]] = [[] for _ in prompts]
    bar = tqdm(total=len(prompts), desc="recording target outputs")
    by_length = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # little padding per batch
    for lo in range(0, len(prompts), batch):
        rows = by_length[lo : lo + batch]
        width = max(len(prompts[i]) for i in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for b, i in enumerate(rows):
            ids[b, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[b, width - len(prompts[i]) :] = True
        positions = (mask.long().cumsum(dim=1) - 1).clamp_min(0)
        hidden, past = fast.forward(ids, positions, None, mask)
        last = hidden[:, -1]
        done = [False] * len(rows)
        for _ in range(max_tokens):
            tokens = head(last).argmax(dim=-1)
            for b, i in enumerate(rows):
                if not done[b]:
                    outputs[i].append(int(tokens[b]))
                    if int(tokens[b]) == eos or len(outputs[i]) >= max_tokens:
                        done[b] = True
                        bar.update(1)
            if all(done):
                break
            positions = positions[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.bool)], dim=1)
            hidden, past = fast.forward(tokens[:, None], positions, past, mask)
            last = hidden[:, -1]
    bar.close()
    return outputs


def record(args: argparse.Namespace, prompts: list[tuple[str, str]] | None) -> tuple[list[Trace], Any]:
    """Traces for the prompts (None: the multiturn conversations' turns), from the cache when
    recorded before with the same settings."""
    import torch
    from banditspec.drafters.registry import build_drafters
    from banditspec.engine.models import load_tokenizer
    from banditspec.evaluation.replay import Trace, record_proposals
    from banditspec.paths import cache_dir
    from banditspec.text import prompt_ids

    tokenizer = load_tokenizer(args.model)
    known_outputs = None
    if prompts is None:
        turns = conversation_prompts(args, tokenizer)
        prompts = [(kind, "") for kind, _, _ in turns]
        ids = [list(p) for _, p, _ in turns]
        known_outputs = [list(o) for _, _, o in turns]
    else:
        ids = [prompt_ids(tokenizer, text, chat=True) for _, text in prompts]
    names = [d.strip() for d in args.drafters.split(",") if d.strip()]
    drafter_names = [d for d in names if d not in COSTLY]
    key = hashlib.sha256(json.dumps([args.model, args.max_tokens, args.record_len, drafter_names, ids]).encode()).hexdigest()[:16]
    path = cache_dir() / "traces" / f"{key}.jsonl"
    engine = None
    if path.exists():
        traces = [Trace.from_dict(json.loads(line)) for line in path.read_text().splitlines()]
    else:
        from banditspec.engine.reference import ReferenceEngine

        torch.set_num_threads(max(1, args.threads))
        engine = ReferenceEngine.from_name(args.model, max_context=4096, cache_entries=max(8, args.batch))
        if known_outputs is not None:
            outputs = known_outputs
        else:
            with torch.inference_mode():
                outputs = _greedy_batched(engine, ids, args.max_tokens, args.batch)
        drafters = build_drafters(drafter_names, tokenizer)
        from tqdm import tqdm

        traces = [record_proposals(Trace(kind, p, out), drafters, args.record_len)
                  for (kind, _), p, out in tqdm(list(zip(prompts, ids, outputs)), desc="recording proposals")]
        _write_lines(path, [json.dumps(t.as_dict()) for t in traces])
    for name in (d for d in names if d in COSTLY):
        _record_costly(args, name, traces, tokenizer, cache_dir() / "traces" / f"{key}-{name}-{_costly_version(name)}.jsonl",
                       engine)
    return traces, tokenizer


def _costly_version(name: str) -> str:
    """What a costly drafter's recorded proposals depend on besides the traces: for Eagle, the
    served head's weights (a cache recorded with another head must not be reused)."""
    if name == "eagle":
        from banditspec.drafters.eagle import head_weights

        return f"v2-{head_weights().stem}"
    return "v2"


def _write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(path)


def _record_costly(args: argparse.Namespace, name: str, traces: list[Trace], tokenizer: Any, path: Path,
                   engine: ReferenceEngine | None = None) -> None:
    """Add a costly drafter's proposals to the traces (cached beside them): one forward per
    prompt over prompt + output gives the target's states at every position; the drafter's
    session is then fed and asked at every position as decoding would."""
    import torch
    from banditspec.drafters.registry import build_drafters
    from banditspec.engine.contract import VerifyRequest
    from banditspec.evaluation.replay import record_costly_proposals
    from tqdm import tqdm

    if path.exists():
        for trace, line in zip(traces, path.read_text().splitlines()):
            recorded = json.loads(line)
            trace.proposals[name] = recorded["proposals"]
            trace.match_len[name] = [0] * len(trace.proposals[name])
            if recorded.get("previews") is not None:
                trace.previews[name] = recorded["previews"]
        return
    if engine is None:
        from banditspec.engine.reference import ReferenceEngine

        torch.set_num_threads(max(1, args.threads))
        engine = ReferenceEngine.from_name(args.model, max_context=4096, cache_entries=1)
    drafter = build_drafters([name], tokenizer, target_model=engine.model)[name]
    layers = drafter.traits.feature_layers
    with torch.inference_mode():
        for trace in tqdm(traces, desc=f"recording {name} proposals"):
            sequence = np.asarray(trace.prompt_ids + trace.target[:-1], dtype=np.int32)
            engine.clear()
            (result,) = engine.verify([VerifyRequest(sequence, np.zeros(0, dtype=np.int32), hidden_from=0,
                                                     hidden_layers=layers)])
            assert result.hidden_states is not None  # asked for (hidden_from)
            record_costly_proposals(trace, name, drafter, result.hidden_states, args.record_len)
    _write_lines(path, [json.dumps({"proposals": t.proposals[name], "previews": t.previews.get(name)}) for t in traces])


# --- evaluation -------------------------------------------------------------------------


def _curve(name: str) -> list[float]:
    if name == "steep":
        return STEEP
    if name == "flat":
        return FLAT
    if name == "measured":
        data = json.loads(ENGINE_JSON.read_text())
        ms = data["verify_ms"]["fast"]
        return [ms[str(k)] / ms["1"] if str(k) in ms else None for k in data["ks"]]  # type: ignore[misc]
    return [float(x) for x in json.loads(Path(name).read_text())]


def _cost_model(ratios: list[float], max_tokens: int) -> CostModel:
    from banditspec.bandits.cost_model import CostModel

    known = [(k, r) for k, r in enumerate(ratios, start=1) if r is not None]
    xs, ys = np.array([k for k, _ in known], float), np.array([r for _, r in known], float)
    full = [float(np.interp(k, xs, ys)) if k <= xs[-1] else float(ys[-1] + (ys[-1] - ys[-2]) * (k - xs[-1]) / (xs[-1] - xs[-2]))
            for k in range(1, max_tokens + 1)]
    return CostModel.fixed(full)


def _surface_model(max_tokens: int, path: Path = SURFACE_JSON) -> CostModel:
    """The measured verify-cost surface (seconds by context and k) as a cost model."""
    from banditspec.bandits.cost_model import CostModel

    data = json.loads(Path(path).read_text())
    table = {int(c): {int(k): ms / 1e3 for k, ms in row.items()} for c, row in data["verify_ms"].items()}
    return CostModel.from_table(table, max_tokens)


def parse_eagle_cost(text: str) -> tuple[float, float, float | None]:
    """--eagle-cost CALL,TOKEN[,PREVIEW] (units of a one-token verify); with PREVIEW, Eagle is
    replayed with previews on (drafters/eagle.py, DEFAULT_PREVIEWS), else (None) blind."""
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (2, 3) or any(v < 0 for v in values):
        raise SystemExit(f"--eagle-cost: expected CALL,TOKEN[,PREVIEW] (non-negative numbers), got {text!r}")
    return values[0], values[1], values[2] if len(values) == 3 else None


def evaluate(traces: list[Trace], eos_id: int, costs: list[str], max_draft_len: int, drafters: list[str],
             costly_relative: dict[str, tuple[float, float] | tuple[float, float, float | None]] | None = None,
             surface: Path = SURFACE_JSON) -> dict[str, Any]:
    """``costly_relative``: costly drafter -> (per call, per drafted token[, per preview]) in
    units of a one-token verify of each cost model."""
    from banditspec.bandits.cost_model import CostModel
    from banditspec.evaluation.replay import per_step_oracle_seconds, replay_policy
    from tqdm import tqdm

    fixed = [f"fixed:{d}@{g}" for d in drafters for g in range(1, max_draft_len + 1)]
    methods = ["vanilla", *fixed, *ADAPTIVE, K_ONLY, RATE]
    results: dict[str, Any] = {}
    for cost in costs:
        platform = _surface_model(17, surface) if cost == "surface" else _cost_model(_curve(cost), 17)
        curve = platform.curve()
        costly = {d: (c[0] * float(curve[1]), c[1] * float(curve[1])) for d, c in (costly_relative or {}).items()
                  if d in drafters}
        previews = {d: c[2] * float(curve[1]) for d, c in (costly_relative or {}).items()
                    if d in drafters and len(c) > 2 and c[2] is not None}
        per_method = {}
        for method in tqdm(methods, desc=f"replay ({cost})"):
            own = CostModel(max(17, max_draft_len + 1), min_spread=math.inf) if method == K_ONLY else None
            per_method[method] = replay_policy(traces, "costaware" if method in (K_ONLY, RATE) else method, drafters,
                                               platform, max_draft_len=max_draft_len, eos_id=eos_id, costly=costly,
                                               cost_model=own, preview_seconds=previews,
                                               objective="rate" if method == RATE else "ratio")["rows"]
        oracle_step = []
        for trace, row in zip(traces, per_method["vanilla"]):
            oracle_step.append(per_step_oracle_seconds(trace, platform, max_draft_len, drafters, n=row["tokens"] + (1 if trace.target[-1] == eos_id else 0),
                                                       draft_seconds=costly))
        results[cost] = {"methods": per_method, "per_step_oracle": oracle_step, "curve": platform.relative()[:9]}
    return results


def summarise(results: dict[str, Any], traces: list[Trace], workloads: list[str]) -> dict[str, Any]:
    """cost -> workload -> method -> {speedup over plain, mean accepted tokens, identical}."""
    out: dict[str, Any] = {}
    for cost, data in results.items():
        out[cost] = {}
        for workload in workloads:
            idx = [i for i, t in enumerate(traces) if workload == "mixed" or t.kind == workload]
            if not idx:
                continue
            methods = data["methods"]
            plain = sum(methods["vanilla"][i]["seconds"] for i in idx)
            tokens = sum(methods["vanilla"][i]["tokens"] for i in idx)
            table = {}
            for name, rows in methods.items():
                seconds = sum(rows[i]["seconds"] for i in idx)
                steps = sum(rows[i]["steps"] for i in idx)
                table[name] = {"speedup": plain / seconds, "mat": tokens / steps,
                               "identical": all(rows[i]["identical"] for i in idx)}
            fixed_names = [n for n in methods if n.startswith("fixed:")] + ["vanilla"]
            per_prompt = sum(min(methods[n][i]["seconds"] for n in fixed_names) for i in idx)
            table["oracle/prompt"] = {"speedup": plain / per_prompt, "mat": None, "identical": True}
            table["oracle/step"] = {"speedup": plain / sum(data["per_step_oracle"][i] for i in idx), "mat": None, "identical": True}
            best_fixed = max((n for n in fixed_names if n != "vanilla"), key=lambda n: table[n]["speedup"])
            table["best fixed"] = dict(table[best_fixed], arm=best_fixed)
            out[cost][workload] = table
    return out


def _markdown(summary: dict[str, Any], args: argparse.Namespace, n_traces: int, results: dict[str, Any]) -> str:
    if args.prompts_file is not None:
        source = f"prompts of {args.prompts_file}"
    elif is_multiturn(args):
        source = (f"turns of {MULTITURN} conversations ({args.turns} user turns each, the target's own greedy answers "
                  f"as history; `mixed` = all turns), split {describe(args.split)}")
    else:
        source = f"prompts of {args.workloads}, split {describe(args.split)}"
    lines = [f"Replay over {n_traces} {source}; greedy (temperature 0); {args.max_tokens} tokens max, "
             f"L = {args.max_draft_len}, drafters {args.drafters} (best fixed: the best of every drafter at every "
             "gamma); speed = plain decoding's time / the method's time (decode only, from the cost model).", ""]
    for cost, per_workload in summary.items():
        curve = results[cost]["curve"]
        lines += [f"### cost model `{cost}`: verify(k)/verify(1) for k = 1..9: {', '.join(f'{c:.2f}' for c in curve)}", ""]
        cols = ["costaware", K_ONLY, RATE, "ucbspec", "exp3spec", "best fixed", "oracle/prompt", "oracle/step"]
        lines += ["| workload | " + " | ".join(cols) + " | costaware / best fixed | costaware / oracle per prompt |",
                  "|---|" + "---|" * (len(cols) + 2)]
        for workload, table in per_workload.items():
            cells = []
            for c in cols:
                cell = f"{table[c]['speedup']:.3f}x"
                if c == "best fixed":
                    cell += f" ({table[c]['arm'][6:]})"
                if table[c]["mat"]:
                    cell += f", MAT {table[c]['mat']:.2f}"
                cells.append(cell)
            ratio_fixed = table["costaware"]["speedup"] / table["best fixed"]["speedup"]
            ratio_oracle = table["costaware"]["speedup"] / table["oracle/prompt"]["speedup"]
            lines.append(f"| {workload} | " + " | ".join(cells) + f" | {ratio_fixed:.3f} | {ratio_oracle:.3f} |")
        identical = all(v["identical"] for t in per_workload.values() for v in t.values())
        lines += ["", f"Every replayed output identical to plain decoding: {identical}.", ""]
    return "\n".join(lines)


def _plot(summary: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = list(summary)
    fig, axes = plt.subplots(1, len(costs), figsize=(5 * len(costs), 4), squeeze=False)
    cols = ["costaware", "ucbspec", "exp3spec", "best fixed", "oracle/prompt", "oracle/step"]
    for ax, cost in zip(axes[0], costs):
        workloads = list(summary[cost])
        width = 0.8 / len(cols)
        for j, c in enumerate(cols):
            ax.bar(np.arange(len(workloads)) + j * width, [summary[cost][w][c]["speedup"] for w in workloads], width, label=c)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(np.arange(len(workloads)) + 0.4 - width / 2, workloads)
        ax.set_title(f"cost model: {cost}")
        ax.set_ylabel("speed vs plain decoding")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "replay.png", dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    check_replay_options(args)
    prompts = None if is_multiturn(args) else _prompts(args)
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    missing = [d for d in drafters if d in COSTLY and not _buildable(d, args.model)]
    if missing:
        print(f"drafter(s) {', '.join(missing)} unavailable here (not built): replaying without them; the best fixed "
              "arm then leaves them out")
        drafters = [d for d in drafters if d not in missing]
        args.drafters = ",".join(drafters)
    traces, tokenizer = record(args, prompts)
    costs = [c.strip() for c in args.costs.split(",") if c.strip()]
    surface = getattr(args, "surface", SURFACE_JSON)
    for name, path in (("measured", ENGINE_JSON), ("surface", surface)):
        if name in costs and not path.exists():
            print(f"no {path} (run banditspec bench-engine): skipping the {name} cost model")
            costs.remove(name)
    call, token, preview = parse_eagle_cost(args.eagle_cost)
    results = evaluate(traces, int(tokenizer.eos_token_id), costs, args.max_draft_len, drafters,
                       {d: (call, token, preview) for d in drafters if d in COSTLY},
                       surface=surface)
    kinds = sorted({t.kind for t in traces})
    summary = summarise(results, traces, kinds + (["mixed"] if len(kinds) > 1 else []))
    args.out.mkdir(parents=True, exist_ok=True)
    text = _markdown(summary, args, len(traces), results)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(
        {"setup": {"split": None if args.prompts_file is not None else args.split, "temperature": 0.0,
                   "workloads": None if args.prompts_file is not None else args.workloads},
         **summary}, indent=1) + "\n")
    _plot(summary, args.out)
    print(text)
    if args.wallclock > 0:
        check = wallclock_check(args, traces, tokenizer, drafters)
        (args.out / "wallclock_check.json").write_text(json.dumps(check, indent=1) + "\n")
        check_text = _wallclock_markdown(check)
        (args.out / "wallclock_check.md").write_text(check_text)
        _wallclock_plot(check, args.out)
        print(check_text)
    return 0


def _buildable(name: str, model: str) -> bool:
    """Whether drafter ``name`` can be built here (the Eagle head needs its trained weights)."""
    from banditspec.drafters.registry import build_drafters
    from banditspec.engine.models import load_tokenizer
    from banditspec.engine.reference import ReferenceEngine

    try:
        engine = ReferenceEngine.from_name(model, max_context=64, cache_entries=1)
        return name in build_drafters([name], load_tokenizer(model), target_model=engine.model)
    except Exception:
        return False


# --- replay vs wall clock --------------------------------------------------------------


def _decode_rate(step_seconds: list[float], accepted: list[int]) -> tuple[int, float]:
    """(tokens, seconds) of a request after its first step (the first step carries the
    prompt's prefill, which the replay models only roughly, so both sides leave it out)."""
    return sum(a + 1 for a in accepted[1:]), float(sum(step_seconds[1:]))


def wallclock_check(args: argparse.Namespace, traces: list[Trace], tokenizer: Any, drafters: list[str]) -> dict[str, Any]:
    """Decode the first ``--wallclock`` prompts of each workload for real with each method,
    then replay the same prompts and methods with the live engine's cost model (its
    calibrated verify surface and per-step overhead, in seconds), and compare tokens/s after
    the first step: predicted / measured per workload and method, and the speed-ups over
    plain decoding both ways. Outputs must equal the recorded greedy output."""
    import time

    import torch
    from banditspec.config import GenerationRequest
    from banditspec.decoding.decoder import SpeculativeDecoder
    from banditspec.decoding.session import run_to_completion
    from banditspec.engine.reference import ReferenceEngine
    from banditspec.evaluation.replay import replay_policy
    from banditspec.serving.runtime import build_drafters, calibrate_cost_model
    from tqdm import tqdm

    torch.set_num_threads(max(1, args.threads))
    eos = int(tokenizer.eos_token_id)
    kinds = sorted({t.kind for t in traces})
    seen: dict[str, int] = {}
    subset = []  # the first N prompts of each workload, in recording (serving) order
    for trace in traces:
        seen[trace.kind] = seen.get(trace.kind, 0) + 1
        if seen[trace.kind] <= args.wallclock:
            subset.append(trace)
    methods = [m.strip().replace("{L}", str(args.max_draft_len)) for m in args.wallclock_methods.split(",") if m.strip()]
    arms = [f"{d}@{args.max_draft_len}" for d in drafters]
    engine = ReferenceEngine.from_name(args.model, max_context=2048)
    measured: dict[str, list[dict]] = {m: [] for m in methods}
    started = time.perf_counter()
    live: CostModel | None = None
    with torch.inference_mode():
        for method in tqdm(methods, desc="wall clock (methods)"):
            # Fresh drafters and decoder per method, prompts in recording order: the suffix
            # tree learns from past requests, so it sees exactly the history it had when the
            # proposals were recorded (not another method's run of the same prompt).
            decoder = SpeculativeDecoder.for_engine(engine, build_drafters(drafters, tokenizer, target_model=engine.model),
                                                    default_arms=arms)
            calibrate_cost_model(decoder, engine)
            for trace in tqdm(subset, desc=method, leave=False):
                max_tokens = len(trace.target) - (1 if trace.target and trace.target[-1] == eos else 0)
                engine.clear()
                request = GenerationRequest(trace.prompt_ids, max_tokens, policy=method, max_draft_len=args.max_draft_len)
                result = run_to_completion(engine, decoder.start(request))
                tokens, seconds = _decode_rate(result.stats.step_seconds, result.stats.accepted)
                measured[method].append({"kind": trace.kind, "tokens": tokens, "seconds": seconds,
                                         "identical": result.token_ids == trace.target[:max_tokens]})
            if method == "costaware" or live is None:
                live = decoder.cost_model
    wall_minutes = (time.perf_counter() - started) / 60
    assert live is not None  # at least one method ran
    # The live model is the platform: seconds per round by k and context, overhead included.
    curve = live.curve()
    platform = live
    predicted: dict[str, list[dict]] = {}
    for method in methods:
        rows = replay_policy(subset, method, arms, platform, max_draft_len=args.max_draft_len, eos_id=eos,
                             costly={d: c for d, c in live.draft_costs().items() if d in COSTLY})["rows"]
        predicted[method] = []
        for row in rows:
            tokens, seconds = _decode_rate(row["step_seconds"], row["accepted"])
            predicted[method].append({"kind": row["kind"], "tokens": tokens, "seconds": seconds})
    def rate(rows: list[dict], kind: str) -> float:
        picked = [r for r in rows if kind == "mixed" or r["kind"] == kind]
        return sum(r["tokens"] for r in picked) / max(1e-12, sum(r["seconds"] for r in picked))

    table: dict = {}
    for kind in kinds + (["mixed"] if len(kinds) > 1 else []):
        table[kind] = {m: {"measured_tps": rate(measured[m], kind), "predicted_tps": rate(predicted[m], kind)} for m in methods}
        plain = table[kind].get("vanilla")
        for entry in table[kind].values():
            entry["predicted_over_measured"] = entry["predicted_tps"] / entry["measured_tps"]
            if plain:
                entry["measured_speedup"] = entry["measured_tps"] / plain["measured_tps"]
                entry["predicted_speedup"] = entry["predicted_tps"] / plain["predicted_tps"]
    return {
        "prompts_per_workload": args.wallclock, "max_tokens": args.max_tokens, "L": args.max_draft_len,
        "threads": args.threads, "drafters": drafters, "methods": methods, "minutes": round(wall_minutes, 1),
        "cost_curve_seconds": [float(c) for c in curve[1:10]],
        "identical": {m: all(r["identical"] for r in rows) for m, rows in measured.items()},
        "table": table,
    }


def _wallclock_markdown(check: dict[str, Any]) -> str:
    lines = [
        f"Replay vs wall clock: {check['prompts_per_workload']} prompts per workload, {check['max_tokens']} tokens max, "
        f"L = {check['L']}, {check['threads']} thread(s), drafters {', '.join(check['drafters'])}; tokens/s after each "
        "request's first step (its prefill), in process; the replay uses the live engine's cost model "
        f"(verify seconds for k = 1..9: {', '.join(f'{1e3 * c:.1f}' for c in check['cost_curve_seconds'])} ms).",
        "",
        "| workload | method | measured tok/s | predicted tok/s | predicted / measured | speed-up measured | speed-up predicted |",
        "|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for kind, methods in check["table"].items():
        for method, e in methods.items():
            worst = max(worst, abs(e["predicted_over_measured"] - 1))
            lines.append(f"| {kind} | {method} | {e['measured_tps']:.2f} | {e['predicted_tps']:.2f} | "
                         f"{e['predicted_over_measured']:.3f} | {e.get('measured_speedup', float('nan')):.3f} | "
                         f"{e.get('predicted_speedup', float('nan')):.3f} |")
    lines += ["", f"Largest disagreement: {100 * worst:.1f} % of the measured rate. Every real output identical to the "
              f"recorded greedy output: {all(check['identical'].values())}. Wall-clock part: {check['minutes']} min.", ""]
    return "\n".join(lines)


def _wallclock_plot(check: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    for kind, methods in check["table"].items():
        xs = [e["measured_tps"] for e in methods.values()]
        ys = [e["predicted_tps"] for e in methods.values()]
        ax.scatter(xs, ys, label=kind)
    lo = min(min(e["measured_tps"], e["predicted_tps"]) for m in check["table"].values() for e in m.values())
    hi = max(max(e["measured_tps"], e["predicted_tps"]) for m in check["table"].values() for e in m.values())
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
    ax.plot([lo, hi], [1.1 * lo, 1.1 * hi], color="grey", linestyle=":", linewidth=0.8)
    ax.plot([lo, hi], [0.9 * lo, 0.9 * hi], color="grey", linestyle=":", linewidth=0.8, label="±10 %")
    ax.set_xlabel("measured tokens/s")
    ax.set_ylabel("replay's predicted tokens/s")
    ax.set_title("replay vs wall clock (one point per workload x method)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "wallclock_check.png", dpi=110)
    plt.close(fig)
