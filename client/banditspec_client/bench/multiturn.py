"""``banditspec bench --workload multiturn``: conversations through the OpenAI chat API, per method.

Each conversation of the ``multiturn`` workload (:func:`~banditspec_client.bench.workloads.load_conversations`)
is played once per method: turn k is sent to ``/v1/chat/completions`` (streamed) with turns
1..k-1 and the model's OWN answers to them (from this method's earlier turns) as history, so the
prompt is the whole conversation and every drafter sees it. The server is a real tritonserver with
the default prefix cache (``cache_entries`` 16) and the OpenAI API in front of it; methods that
feed the suffix drafter's global trie get a private copy of the controller model, as in
:mod:`~banditspec_client.bench.through_triton`, each with its own OpenAI front end.

Per turn: tokens/s (generated tokens / the streamed request's seconds), time to first token (the
first chunk with text), its new tokens (the prompt positions the target computed: the prompt less
``speculation_stats.cached_prompt_tokens``, what the target found in its prefix cache), and, for
turns k >= 2, a *control*: a first turn (no history, 1 token) with as many new tokens, the same
user turn behind a neutral preamble long enough to make up the difference (a turn also feeds the
end of the previous answer and the chat template's turn boundary). Turn k's first token as fast as
its control's means the history's KV was reused, not recomputed. Between conversations (and
methods) the target's cache is emptied, so no method reuses another's prefill.

Under greedy decoding every method's answers (hence histories) must equal plain decoding's.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from banditspec.engine.prefix_cache import common_prefix_length

from banditspec_client.bench.methods import VANILLA, Method, digest, rotated
from banditspec_client.bench.report import MISSING, fmt, markdown_table, pyplot, save_png
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.workloads import Conversation

if TYPE_CHECKING:
    from banditspec_server.openai_api.server import OpenAIServer

CACHE_ENTRIES = 16  # the target's default (model_repository/target/config.pbtxt)
CONTROL_MAX_TOKENS = 1
# what a control's user turn is lengthened by, one token a word; a different word at each turn, so
# that a control reuses nothing of an earlier control still in the target's cache
PREAMBLE_WORDS = ("ok ", "so ", "yes ", "now ", "well ", "then ")
MAX_PREAMBLE_WORDS = 512


@dataclass
class TurnRecord:
    """One turn of one conversation with one method.

    prompt_tokens: the whole rendered conversation up to this turn
    new_tokens:    prompt positions the target computed: the prompt less the tokens it found in
                   its prefix cache (``cached_prompt_tokens``). Where the target does not say: the
                   prompt tokens past the longest prefix shared with the previous request of this
                   conversation as the API renders it (an estimate: the cache holds the answer's
                   own tokens, which may tokenize differently once decoded to text)
    ttft_seconds:  request sent -> first chunk with text
    first_call_ms: the target's time for the request's first call (its prefill), from
                   ``speculation_stats.verify_ms``: what of the TTFT the engine took
    control_*:     turns >= 2: a first turn (no history, 1 token) with as many new tokens: the same
                   user turn behind a neutral preamble (:meth:`ConversationRunner._lengthened`)
    """

    conversation_id: str
    turn: int
    method: str
    prompt_tokens: int
    new_tokens: int
    generated_tokens: int
    seconds: float
    ttft_seconds: float
    steps: int
    output_digest: str
    finish_reason: str = ""
    control_ttft_seconds: float | None = None
    control_new_tokens: int | None = None
    first_call_ms: float | None = None
    control_first_call_ms: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


def computed_tokens(prompt_tokens: int, stats: dict) -> int | None:
    """Of a prompt of ``prompt_tokens``, the positions the target computed (None when it does not
    say what it found in its prefix cache)."""
    cached = stats.get("cached_prompt_tokens")
    if not isinstance(cached, int) or isinstance(cached, bool):
        return None
    return prompt_tokens - cached


def first_call_ms(stats: dict) -> float | None:
    """The target's milliseconds for a request's first call (None when the stats lack it)."""
    calls = stats.get("verify_ms") or []
    return float(calls[0]) if calls else None


@dataclass
class StreamedAnswer:
    text: str
    seconds: float
    ttft_seconds: float
    stats: dict


def stream_chat(url: str, messages: list[dict], *, max_tokens: int, temperature: float, seed: int,
                method: Method, arms: Sequence[str] | None, max_draft_len: int, timeout: float = 600) -> StreamedAnswer:
    """One streamed ``/v1/chat/completions`` request (plain HTTP, server-sent events)."""
    body: dict = {"model": "banditspec", "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                  "seed": seed, "stream": True, "policy": method.policy, "max_draft_len": max_draft_len}
    if arms is not None:
        body["arms"] = list(arms)  # the OpenAI API has no reward field: adaptive methods get the server's
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    parts: list[str] = []
    stats: dict = {}
    first: float | None = None
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"the server failed the request: {chunk['error']}")
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content") or ""
                if text and first is None:
                    first = time.perf_counter() - started
                parts.append(text)
            if chunk.get("speculation_stats"):
                stats = chunk["speculation_stats"]
    seconds = time.perf_counter() - started
    return StreamedAnswer("".join(parts), seconds, seconds if first is None else first, stats)


class ConversationRunner:
    """A real tritonserver (default prefix cache) and one OpenAI front end per controller copy."""

    def __init__(self, settings: RunSettings, methods: Sequence[Method], *, log_path: Path | None = None):
        from banditspec_client.bench.through_triton import TritonRunner

        self.settings = settings
        self.triton = TritonRunner(settings, methods, log_path=log_path, cache_entries=CACHE_ENTRIES)
        self.fronts: dict[str, OpenAIServer] = {}
        self.tokenizer = None

    def __enter__(self) -> ConversationRunner:
        from banditspec_server.openai_api.server import OpenAIServer, load_tokenizer
        from banditspec_server.serve import free_port

        self.triton.__enter__()
        try:
            self.tokenizer = load_tokenizer(self.settings.model)
            for model_name in sorted(set(self.triton.model_for.values())):
                self.fronts[model_name] = OpenAIServer(self.triton.grpc_url, port=free_port(), tokenizer=self.tokenizer,
                                                       triton_model=model_name).start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for front in self.fronts.values():
            front.stop()
        self.fronts = {}
        self.triton.close()

    def available(self, methods: Sequence[Method]) -> tuple[list[Method], dict[str, str]]:
        return self.triton.available(methods)

    @property
    def adaptive_arms(self) -> list[str]:
        return self.triton.adaptive_arms

    def _ids(self, messages: list[dict], reply: bool = True) -> list[int]:
        from banditspec.text import render_chat, text_ids

        return text_ids(self.tokenizer, render_chat(self.tokenizer, messages, reply=reply))

    def _ask(self, method: Method, messages: list[dict], max_tokens: int) -> StreamedAnswer:
        url = self.fronts[self.triton.model_for[method.name]].url
        return stream_chat(url, messages, max_tokens=max_tokens, temperature=self.settings.temperature,
                           seed=self.settings.seed, method=method,
                           arms=self.adaptive_arms if method.adaptive else None,
                           max_draft_len=method.draft_len(self.settings.max_draft_len))

    def run(self, conversation: Conversation, method: Method, max_tokens: int) -> list[TurnRecord]:
        """Every turn of ``conversation`` with ``method``, the model's own answers as history."""
        self.triton._flush()  # no prefill of another conversation or method is reused
        messages: list[dict] = []
        previous: list[int] = []  # the cache is empty: turn 1 prefills all of its prompt
        # a control runs while this conversation's sequences are cached: it reuses the prefix every
        # chat shares (the system prompt and the user turn's header)
        system_prefix = self._ids([{"role": "user", "content": ""}])
        records = []
        for turn, user in enumerate(conversation.turns, start=1):
            messages.append({"role": "user", "content": user})
            ids = self._ids(messages)
            answer = self._ask(method, messages, max_tokens)
            computed = computed_tokens(len(ids), answer.stats)
            record = TurnRecord(
                conversation_id=conversation.conversation_id, turn=turn, method=method.name, prompt_tokens=len(ids),
                new_tokens=computed if computed is not None else len(ids) - common_prefix_length_list(ids, previous),
                generated_tokens=int(answer.stats.get("generated_tokens", 0)), seconds=answer.seconds,
                ttft_seconds=answer.ttft_seconds, steps=int(answer.stats.get("steps", 0)),
                output_digest=digest(answer.text), finish_reason=str(answer.stats.get("finish_reason", "")),
                first_call_ms=first_call_ms(answer.stats),
            )
            messages.append({"role": "assistant", "content": answer.text})
            previous = self._ids(messages, reply=False)
            if turn >= 2:
                control_messages = [{"role": "user", "content": self._lengthened(user, record.new_tokens, system_prefix, turn)}]
                control_ids = self._ids(control_messages)
                control = self._ask(method, control_messages, CONTROL_MAX_TOKENS)
                record.control_ttft_seconds = control.ttft_seconds
                record.control_first_call_ms = first_call_ms(control.stats)
                control_computed = computed_tokens(len(control_ids), control.stats)
                record.control_new_tokens = (control_computed if control_computed is not None else
                                             len(control_ids) - common_prefix_length_list(control_ids, system_prefix))
            records.append(record)
        return records

    def _lengthened(self, user: str, new_tokens: int, system_prefix: list[int], turn: int) -> str:
        """``user`` behind the shortest preamble of the turn's word (:data:`PREAMBLE_WORDS`) that
        gives a first turn at least ``new_tokens`` new tokens (past the prefix every chat shares)."""
        for words in range(MAX_PREAMBLE_WORDS + 1):
            text = PREAMBLE_WORDS[turn % len(PREAMBLE_WORDS)] * words + user
            ids = self._ids([{"role": "user", "content": text}])
            if len(ids) - common_prefix_length_list(ids, system_prefix) >= new_tokens:
                return text
        return text


def common_prefix_length_list(a: Sequence[int], b: Sequence[int]) -> int:
    import numpy as np

    return common_prefix_length(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))


WARMUP = Conversation("warm-up", ("Name three colours.", "And three more."))


def run_conversations(runner: ConversationRunner, conversations: Sequence[Conversation], methods: Sequence[Method],
                      max_tokens: int, progress: Any = None) -> list[TurnRecord]:
    """Every method on every conversation, the method order rotated per conversation, after a
    warm-up conversation per method (first calls, the controller's cost calibration; not kept)."""
    for method in methods:
        runner.run(WARMUP, method, 8)
    records: list[TurnRecord] = []
    for index, conversation in enumerate(conversations):
        for method in rotated(methods, index):
            records += runner.run(conversation, method, max_tokens)
            if progress is not None:
                progress.set_postfix_str(f"{conversation.conversation_id} {method.name}", refresh=False)
                progress.update(1)
    return records


# -- summary ---------------------------------------------------------------------------------


@dataclass
class TurnSummary:
    method: str
    turn: int
    requests: int
    tokens: int
    seconds: float
    mean_prompt_tokens: float
    mean_new_tokens: float
    mean_ttft: float
    speedup: float | None = None  # tokens/s over vanilla's on the same turns
    mean_control_ttft: float | None = None
    mean_control_new_tokens: float | None = None
    ttft_over_control: float | None = None  # mean over requests of ttft / control ttft
    mean_first_call_ms: float | None = None  # the target's first call (the prefill), where reported
    mean_control_first_call_ms: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def summarize_turns(records: Sequence[TurnRecord], methods: Sequence[str]) -> list[TurnSummary]:
    """Per method and turn index, over the conversations every method finished."""
    complete = {r.conversation_id for r in records}
    for m in methods:
        complete &= {r.conversation_id for r in records if r.method == m}
    rows: list[TurnSummary] = []
    turns = sorted({r.turn for r in records})
    for m in methods:
        for turn in turns:
            picked = [r for r in records if r.method == m and r.turn == turn and r.conversation_id in complete]
            if not picked:
                continue
            n = len(picked)
            row = TurnSummary(m, turn, n, sum(r.generated_tokens for r in picked), sum(r.seconds for r in picked),
                              sum(r.prompt_tokens for r in picked) / n, sum(r.new_tokens for r in picked) / n,
                              sum(r.ttft_seconds for r in picked) / n)
            controls = [r for r in picked if r.control_ttft_seconds]
            if controls:
                row.mean_control_ttft = sum(r.control_ttft_seconds or 0.0 for r in controls) / len(controls)
                row.mean_control_new_tokens = sum(r.control_new_tokens or 0 for r in controls) / len(controls)
                row.ttft_over_control = sum(r.ttft_seconds / (r.control_ttft_seconds or 1.0) for r in controls) / len(controls)
            row.mean_first_call_ms = _mean([r.first_call_ms for r in picked])
            row.mean_control_first_call_ms = _mean([r.control_first_call_ms for r in controls])
            rows.append(row)
    plain = {r.turn: r for r in rows if r.method == VANILLA}
    for row in rows:
        base = plain.get(row.turn)
        if base is not None and base.tokens_per_second > 0:
            row.speedup = row.tokens_per_second / base.tokens_per_second
    return rows


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values, None when any is missing (or there are none)."""
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None) / len(values)


def lossless_mismatches(records: Sequence[TurnRecord]) -> list[tuple[str, int, str]]:
    """(conversation, turn, method) whose answer differs from vanilla's (greedy runs only)."""
    plain = {(r.conversation_id, r.turn): r.output_digest for r in records if r.method == VANILLA}
    return [(r.conversation_id, r.turn, r.method) for r in records
            if (r.conversation_id, r.turn) in plain and r.output_digest != plain[(r.conversation_id, r.turn)]]


def markdown_report(rows: Sequence[TurnSummary], records: Sequence[TurnRecord], *, title: str, command: str,
                    setup: dict, skipped: dict[str, str], greedy: bool) -> str:
    parts = [f"# {title}", "", f"Command: `{command}`", ""]
    parts += [f"- {k}: {v}" for k, v in setup.items()]
    parts += [f"- skipped method `{name}`: {reason}" for name, reason in skipped.items()]
    parts += ["", "Per turn index (turn k is sent with turns 1..k-1 and the model's own answers as history). "
              "`new tokens`: the prompt positions the target computed (the prompt less what it found in its prefix "
              "cache). `control`: a first turn "
              f"({CONTROL_MAX_TOKENS} token) with as many new tokens (the same user turn behind a neutral preamble); "
              "TTFT / control near 1 means the history's KV was reused. `1st call ms`: the target's time for the "
              "request's first call (its prefill), of the TTFT.",
              ""]
    header = ["method", "turn", "requests", "prompt tokens", "new tokens", "tokens/s", "speedup", "TTFT ms",
              "control TTFT ms", "control new tokens", "TTFT / control", "1st call ms", "control 1st call ms"]
    table_rows = [[r.method, r.turn, r.requests, f"{r.mean_prompt_tokens:.0f}", f"{r.mean_new_tokens:.0f}",
                   f"{r.tokens_per_second:.1f}", fmt(r.speedup, "{:.2f}x"), f"{1e3 * r.mean_ttft:.0f}",
                   fmt(None if r.mean_control_ttft is None else 1e3 * r.mean_control_ttft, "{:.0f}"),
                   fmt(r.mean_control_new_tokens, "{:.0f}"), fmt(r.ttft_over_control, "{:.2f}"),
                   fmt(r.mean_first_call_ms, "{:.0f}"), fmt(r.mean_control_first_call_ms, "{:.0f}")] for r in rows]
    parts += [markdown_table(header, table_rows, "lrrrrrrrrrrrr"), ""]
    if greedy:
        bad = lossless_mismatches(records)
        if bad:
            shown = ", ".join(f"{m} on {c} turn {t}" for c, t, m in bad[:5])
            parts += [f"**Answer differs from vanilla** ({len(bad)} turns): {shown}", ""]
        elif any(r.method == VANILLA for r in records):
            parts += ["Lossless: every method's answer equals vanilla's on every turn (so every history too).", ""]
    else:
        parts += ["Sampled: answers (and so later turns' histories) are not compared with vanilla's; speculative "
                  "sampling keeps the target's distribution, not its draw for a seed.", ""]
    return "\n".join(parts)


def write_results(out: Path, *, command: str, setup: dict, methods: Sequence[Method], skipped: dict[str, str],
                  records: Sequence[TurnRecord], greedy: bool) -> list[Path]:
    rows = summarize_turns(records, [m.name for m in methods])
    title = f"BanditSpec multi-turn benchmark ({setup.get('mode', 'openai')}, {setup.get('model', '')})"
    report = markdown_report(rows, records, title=title, command=command, setup=setup, skipped=skipped, greedy=greedy)
    (out / "results.md").write_text(report)
    payload = {"command": command, "setup": setup, "methods": [asdict(m) for m in methods], "skipped": skipped,
               "turns": [asdict(r) for r in rows], "records": [asdict(r) for r in records]}
    (out / "results.json").write_text(json.dumps(payload, separators=(",", ":")))
    return [out / "results.md", out / "results.json", plot_turns(rows, out / "turns.png")]


def plot_turns(rows: Sequence[TurnSummary], path: Path) -> Path:
    """Two panels against the turn index, a line per method: tokens/s, and time to first token
    beside the controls' (first turns with as many new tokens)."""
    plt = pyplot()
    fig, (speed, ttft) = plt.subplots(1, 2, figsize=(10, 4))
    for method in dict.fromkeys(r.method for r in rows):
        mine = [r for r in rows if r.method == method]
        turns = [r.turn for r in mine]
        line, = speed.plot(turns, [r.tokens_per_second for r in mine], marker="o", label=method)
        ttft.plot(turns, [1e3 * r.mean_ttft for r in mine], marker="o", color=line.get_color(), label=method)
        controls = [(r.turn, 1e3 * r.mean_control_ttft) for r in mine if r.mean_control_ttft is not None]
        if controls:
            ttft.plot(*zip(*controls), linestyle="--", marker="x", color=line.get_color(),
                      label=f"{method}, a first turn as long (control)")
    speed.set(xlabel="turn", ylabel="output tokens/s", title="speed per turn")
    ttft.set(xlabel="turn", ylabel="ms", title="time to first token (mean)")
    for ax in (speed, ttft):
        ax.set_xticks(sorted({r.turn for r in rows}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_png(fig, path)


def summary_line(rows: Sequence[TurnSummary]) -> str:
    """One line per method for the console: tokens/s by turn and TTFT / control."""
    out = []
    for method in dict.fromkeys(r.method for r in rows):
        cells = [f"turn {r.turn}: {r.tokens_per_second:.1f} tok/s"
                 + (f" (TTFT/control {r.ttft_over_control:.2f})" if r.ttft_over_control is not None else "")
                 for r in rows if r.method == method]
        out.append(f"{method}: " + "; ".join(cells) if cells else f"{method}: {MISSING}")
    return "\n".join(out)
