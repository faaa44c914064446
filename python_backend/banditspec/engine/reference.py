"""The torch reference engine: verifies drafts with a transformers Llama on CPU.

It speaks :class:`banditspec.engine.contract.Engine`. Each ``verify`` call runs ONE
forward pass for the whole batch over each sequence's new tokens only (the part
of ``input_ids + draft_ids`` not found in the prefix KV cache), then decides per
sequence: greedy acceptance at temperature 0, speculative sampling otherwise
(math in :mod:`banditspec.engine.sampling`, cache in
:mod:`banditspec.engine.prefix_cache`).

Batching: sequences with different cached lengths ``c_b`` and different numbers of
new tokens ``n_b`` share one pass. On the panel kernels (the default) the pass is
PACKED, as TensorRT-LLM's inflight batches are (remove_input_padding, paged KV): the
sequences' new tokens sit side by side in one block of sum(n_b) rows, every projection
runs once over that block, and each sequence attends to its own K/V buffer, into which
its new positions are written in place (:meth:`FastLlama.forward_packed`). No row or key
is padded and no cache is copied, so a pass costs what its rows cost (what the
controller's batch pricing assumes), and every sequence's results are bitwise its solo
results. On the other kernels each sequence's cached K/V are padded on the LEFT to the
longest cached length ``C``, its new tokens on the RIGHT to the most new tokens ``N``;
a [B, C + N] attention mask hides both kinds of padding and explicit ``position_ids``
(``c_b + j``) keep rotary positions right. No query row is ever fully masked (each
real token sees itself; pad queries see the real tokens before them), so no NaN
appears; pad rows are discarded. There padding changes the length of the attention
reductions, so a batched row's hidden states differ from its solo run by float
rounding (~1e-5 measured); greedy tokens agree unless the target's top two logits tie
within that noise (true of any change of batch or draft length).

Concurrency: ``verify`` may be called from several threads; a lock runs one
forward pass at a time (batch requests to share a pass).

Hidden states are the decoder's ``last_hidden_state`` (after the final RMSNorm, i.e.
the LM head's input), as :class:`~banditspec.engine.contract.VerifyResult` documents,
or the asked decoder layers' outputs. The prefix cache keeps them with the KV (see
:mod:`banditspec.engine.prefix_cache`), so a request asking for states from position 0
still reuses a cached prefix whose states of that kind are known: its rows below the
first position fed come from the cache, the rest from this pass.

End of sequence: when an accepted draft token equals ``end_id`` the output stops
there. That EOS is reported as the target's own token (the target would have
produced it: under greedy it is the target's argmax), so ``num_accepted`` counts the
draft tokens before it and ``len(output_ids) == num_accepted + 1`` always holds.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import DynamicCache

from banditspec.engine.allocator import keep_freed_memory
from banditspec.engine.bad_words import BadWords, canonical, check_tokens, mask_banned
from banditspec.engine.contract import VerifyRequest, VerifyResult
from banditspec.engine.fast_llama import FastLlama, Linear, PackedLinear, make_linear
from banditspec.engine.kv_buffer import KVBuffer
from banditspec.engine.prefix_cache import (
    FeatureKind,
    Features,
    FeatureStarts,
    LayerKV,
    PrefixCache,
    PrefixHit,
    cache_layers,
)
from banditspec.engine.sampling import (
    count_greedy_accepted,
    coupled_sample,
    make_generator,
    speculative_sample,
    target_distribution,
)
from banditspec.errors import BanditSpecValidationError

if TYPE_CHECKING:
    import numpy.typing as npt

PAD_TOKEN = 0  # fed at right-padding positions; masked, its outputs discarded
KERNELS = ("fast", "onednn", "transformers", "int8")


@dataclass(frozen=True)
class CheckedRequest:
    """A validated :class:`VerifyRequest` in canonical types.

    input_ids:   int32 [seq_len], seq_len >= 1
    draft_ids:   int32 [gamma]
    draft_probs: float64 [gamma, vocab] rows summing to 1, or None (deterministic draft,
                 or greedy verification, which ignores it)
    """

    input_ids: np.ndarray
    draft_ids: np.ndarray
    draft_probs: torch.Tensor | None
    temperature: float
    seed: int
    end_id: int
    hidden_from: int
    hidden_layers: tuple[int, ...] = ()
    bad_words: BadWords = ()

    @property
    def feature_kind(self) -> FeatureKind:
        """The kind of states returned: the asked layers, () (post-norm) when none are asked."""
        return self.hidden_layers if self.hidden_from >= 0 else ()


def validate_request(request: VerifyRequest, vocab_size: int, max_context: int,
                     num_layers: int | None = None) -> CheckedRequest:
    """Check one request; raise :class:`BanditSpecValidationError` naming the bad field."""
    input_ids = _token_ids(request.input_ids, "input_ids", vocab_size)
    draft_ids = _token_ids(request.draft_ids, "draft_input_ids", vocab_size)
    if len(input_ids) == 0:
        raise BanditSpecValidationError("input_ids", "must hold at least one token")
    if len(input_ids) + 1 > max_context:
        raise BanditSpecValidationError(
            "input_ids", f"{len(input_ids)} tokens leave no room in a context of {max_context}"
        )
    if len(input_ids) + len(draft_ids) + 1 > max_context:
        raise BanditSpecValidationError(
            "draft_input_ids",
            f"{len(input_ids)} input + {len(draft_ids)} draft tokens + 1 exceed the context of {max_context}",
        )
    temperature = request.temperature
    is_number = isinstance(temperature, (int, float, np.number))
    if not is_number or not math.isfinite(temperature) or temperature < 0:
        raise BanditSpecValidationError("temperature", f"must be a finite number >= 0, got {temperature!r}")
    for name in ("seed", "end_id", "hidden_from"):
        if not isinstance(getattr(request, name), (int, np.integer)):
            raise BanditSpecValidationError(name, f"must be an int, got {getattr(request, name)!r}")
    if not -1 <= request.hidden_from < len(input_ids):
        raise BanditSpecValidationError(
            "hidden_from", f"must be -1 or in [0, {len(input_ids) - 1}], got {request.hidden_from}"
        )
    layers = tuple(getattr(request, "hidden_layers", ()) or ())
    if any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in layers):
        raise BanditSpecValidationError("hidden_states_layers", f"must be layer indices, got {layers!r}")
    if num_layers is not None and any(not 0 <= int(a) < num_layers - 1 for a in layers):
        raise BanditSpecValidationError(
            "hidden_states_layers", f"layer indices must lie in [0, {num_layers - 2}], got {list(layers)}")
    if len(set(layers)) != len(layers):
        raise BanditSpecValidationError("hidden_states_layers", f"repeats a layer: {list(layers)}")
    draft_probs = None
    if request.draft_probs is not None and temperature > 0:
        draft_probs = _draft_distribution(request.draft_probs, len(draft_ids), vocab_size)
    bad_words = canonical(getattr(request, "bad_words", ()))
    check_tokens(bad_words, vocab_size)
    return CheckedRequest(
        input_ids, draft_ids, draft_probs, float(temperature),
        int(request.seed), int(request.end_id), int(request.hidden_from),
        tuple(int(a) for a in layers), bad_words,
    )


def _token_ids(values: npt.ArrayLike | None, field: str, vocab_size: int) -> np.ndarray:
    """int32 [n] token ids, checked to be integers inside the vocabulary."""
    array = np.asarray(values if values is not None else [])
    if array.size == 0:
        return np.zeros(0, dtype=np.int32)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise BanditSpecValidationError(
            field, f"must be a 1-D array of integer token ids, got {array.dtype} {array.shape}"
        )
    if array.min() < 0 or array.max() >= vocab_size:
        raise BanditSpecValidationError(field, f"token ids must lie in [0, {vocab_size})")
    return array.astype(np.int32)


def _draft_distribution(values: npt.ArrayLike, gamma: int, vocab_size: int) -> torch.Tensor:
    """float64 [gamma, vocab] rows normalised to 1."""
    probs = np.asarray(values, dtype=np.float64)
    if probs.shape != (gamma, vocab_size):
        raise BanditSpecValidationError(
            "draft_probs", f"must have shape ({gamma}, {vocab_size}), got {probs.shape}"
        )
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise BanditSpecValidationError("draft_probs", "must be finite and >= 0")
    sums = probs.sum(axis=1, keepdims=True)
    if np.any(sums <= 0):
        raise BanditSpecValidationError("draft_probs", "every row must have positive mass")
    return torch.from_numpy(probs / sums)


@dataclass
class _Job:
    """One checked request and what the forward pass computes for it.

    prefix:     the reused cached prefix; its length is the first position fed
    new_tokens: int64 [seq_len + gamma - prefix.length], the tokens fed
    """

    request: CheckedRequest
    prefix: PrefixHit
    new_tokens: np.ndarray

    @property
    def start(self) -> int:
        return self.prefix.length

    @property
    def gamma(self) -> int:
        return len(self.request.draft_ids)


@dataclass
class _RowOutput:
    """Forward output of one sequence.

    features: per kind, float32 [n_new, F] states at positions start .. start + n_new - 1:
              always () (the last post-norm state), and the request's feature_kind (the
              asked layers' outputs concatenated; see _features).
    logits:   float32 [gamma + 1, vocab] at positions seq_len - 1 .. seq_len - 1 + gamma.
    layers:   per layer (keys, values) float32 [1, kv_heads, start + n_new, head_dim].
    buffer:   the growable storage ``layers`` are views of (a single job on the fast
              kernels), or None.
    """

    features: Features
    logits: torch.Tensor
    layers: list[LayerKV]
    buffer: KVBuffer | None = None


# Layer-state kinds cached for every sequence once asked for (ReferenceEngine._kept_kinds):
# a kind costs ~7.5 % of a position's KV in the cache (three layers' outputs); a server
# serves one Eagle head, so a second kind is already a rare mix.
KEPT_KINDS = 2


class ReferenceEngine:
    """Target engine over a transformers ``LlamaForCausalLM`` (fp32, CPU).

    Counters: ``forward_passes`` (one per ``verify`` call, or several: :meth:`_passes`), ``positions_computed``
    (real tokens fed through the model) and ``padded_positions`` (padding added to
    batch ragged sequences).
    """

    provides_hidden_states = True

    def __init__(
        self,
        model: Any,
        *,
        max_context: int = 2048,
        cache_entries: int = 8,
        cache_tokens_budget: int | None = None,
        kernels: str = "fast",
    ):
        """model: a transformers LlamaForCausalLM (fp32, CPU), put in eval mode.
        max_context: most tokens a sequence may hold (<= the model's positions).
        cache_entries / cache_tokens_budget: bounds of the prefix cache (sequences /
        tokens in all; the budget defaults to cache_entries * max_context).
        kernels: "fast" (default) runs :class:`~banditspec.engine.fast_llama.FastLlama`
        (fused projections, a few ops per layer) with every projection and the LM head on
        the panel kernel (:mod:`banditspec.engine.panel_kernel`): the weight streams from
        memory once per call whatever the row count, so checking a draft costs little
        more than one token, and a row's projections are bitwise the same in a 1-row and
        a 17-row call. Where that kernel cannot run (no C compiler, no AVX2/FMA) "fast"
        falls back to "onednn" and says so in ``kernel_impl``. "onednn" is FastLlama on
        a column-major GEMV for one row and oneDNN-packed weights for more (the previous
        "fast"). "transformers" runs the model's own forward (column-major weights: the
        engine before both, kept for comparison). "int8" is FastLlama with int8 weights
        and dynamically quantized activations (fbgemm): NOT exact, a token's logits depend
        slightly on how many tokens a call carries, so speculative output may differ from
        this mode's own plain decoding (``bench-engine`` measures how often).
        "fast", "onednn" and "transformers" are fp32; their greedy tokens agree up to float rounding.
        """
        config = model.config
        if not isinstance(max_context, int) or max_context < 2:
            raise BanditSpecValidationError("max_context", f"must be an int >= 2, got {max_context!r}")
        if max_context > config.max_position_embeddings:
            raise BanditSpecValidationError(
                "max_context",
                f"{max_context} exceeds the model's {config.max_position_embeddings} positions",
            )
        if cache_tokens_budget is None:
            cache_tokens_budget = cache_entries * max_context if isinstance(cache_entries, int) else -1
        self.cache = PrefixCache(cache_entries, cache_tokens_budget)
        # Layer-state kinds some request has asked for (EAGLE-3 features), captured and cached
        # for every sequence from then on, asked or not (at most KEPT_KINDS): a later request
        # of that kind then reuses a prompt or a conversation's history that a request
        # without it cached, instead of recomputing the head's window of it.
        self._kept_kinds: list[FeatureKind] = []
        keep_freed_memory()  # per-step K/V buffers reused, not page-faulted anew (engine/allocator.py)
        self.model = model.eval()
        self.tokenizer: Any = None
        self.vocab_size: int = int(config.vocab_size)
        self.max_context = max_context
        eos = config.eos_token_id
        self.eos_id: int = int(eos[0] if isinstance(eos, (list, tuple)) else (-1 if eos is None else eos))
        self._kv_heads = int(config.num_key_value_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self._head_dim = int(head_dim)
        self._dtype = next(model.parameters()).dtype
        self._num_layers = int(config.num_hidden_layers)
        if kernels not in KERNELS:
            raise BanditSpecValidationError("kernels", f"must be one of {', '.join(KERNELS)}, got {kernels!r}")
        self.kernels = kernels
        self._fast: FastLlama | None = None
        self._head: Linear | None = None
        # kernel_impl: what "kernels" runs on here: panel | onednn | int8 | transformers
        self.kernel_impl = kernels
        if kernels == "fast":
            from banditspec.engine.panel_kernel import load

            self.kernel_impl = "panel" if load() is not None else "onednn"
        if kernels != "transformers":
            self._fast = FastLlama(model, linear_kind=self.kernel_impl)
            self._head = make_linear(model.lm_head.weight, self.kernel_impl)
        else:
            # The previous engine: column-major views of the decoder's weights (same values;
            # torch's GEMM over a row-major weight is slower for a few rows) and of the LM head.
            with torch.no_grad():
                for module in model.model.layers.modules():
                    if isinstance(module, torch.nn.Linear):
                        module.weight.data = module.weight.data.t().contiguous().t()
            self._head = PackedLinear(model.lm_head.weight, packed=False)
        self._lock = threading.Lock()
        self.forward_passes = 0
        self.positions_computed = 0
        self.padded_positions = 0

    @classmethod
    def from_name(cls, name: str, **kwargs: Any) -> ReferenceEngine:
        """Engine over a named model of :func:`banditspec.engine.models.load_model` ("smollm2" | "tiny")."""
        from banditspec.engine.models import load_model

        model, tokenizer = load_model(name)
        engine = cls(model, **kwargs)
        engine.tokenizer = tokenizer
        return engine

    # --- cache --------------------------------------------------------------------

    def cached_tokens(self) -> int:
        """Tokens whose KV the prefix cache holds."""
        with self._lock:
            return self.cache.cached_tokens()

    def clear(self) -> None:
        """Drop every cached sequence."""
        with self._lock:
            self.cache.clear()

    # --- verify -------------------------------------------------------------------

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        """Verify a batch (one forward pass, or several: below); results in request order.

        On the panel kernels a request with a long run of new tokens (a prefill of more
        than 2 x ``prefill_chunk``, see :meth:`FastLlama._chunked`) gets a pass of its own,
        in passes of its own, and the others share passes of at most that many padded rows
        (:meth:`_passes`): in one padded batch every sequence's rows would go in one pass,
        past the size where a pass slows down (one thread: four 1536-token prompts 77 s in
        one batch, 49 s apart; eight of 120-300 tokens 17.6-18.6 s against 8.6-10.0 s
        packed; 48 sequences verifying 9 tokens each, 432 rows, 3.2-3.5 s either way). Rows
        are independent of the call on these kernels, so the results are bitwise those of
        one batch.

        Every request is validated before anything runs; a bad one raises
        :class:`BanditSpecValidationError` naming the field.
        """
        checked = [validate_request(request, self.vocab_size, self.max_context, self._num_layers)
                   for request in requests]
        if not checked:
            return []
        with self._lock, torch.inference_mode():
            for request in checked:
                kind = request.feature_kind
                if kind and kind not in self._kept_kinds and len(self._kept_kinds) < KEPT_KINDS:
                    self._kept_kinds.append(kind)
            jobs = [self._plan(request) for request in checked]
            rows: dict[int, _RowOutput] = {}
            for group in self._passes(jobs):
                rows.update(zip(group, self._forward([jobs[i] for i in group])))
            return [self._decide(job, rows[i]) for i, job in enumerate(jobs)]

    def fresh_tokens(self, request: VerifyRequest) -> int:
        """The tokens verifying ``request`` would feed now: its input less what the prefix
        cache holds of it, and its draft (the size of its pass, to order passes by)."""
        checked = validate_request(request, self.vocab_size, self.max_context, self._num_layers)
        with self._lock:
            prefix = self.cache.lookup(checked.input_ids, len(checked.input_ids) - 1, checked.hidden_from,
                                       checked.feature_kind)
        return len(checked.input_ids) + len(checked.draft_ids) - prefix.length

    @property
    def packs_rows(self) -> bool:
        """Whether several sequences share a pass packed (their rows side by side, no
        padding: the panel kernels) rather than padded to the longest (the other kernels)."""
        return self._fast is not None and self.kernel_impl == "panel"

    def _passes(self, jobs: list[_Job]) -> list[list[int]]:
        """Indices of ``jobs`` per forward pass. Panel kernels: a long prefill (more than
        2 x ``prefill_chunk`` new tokens) alone, the others packed, fewest new tokens first,
        into passes of at most that many rows; other kernels: one pass."""
        if len(jobs) == 1 or not self.packs_rows:
            return [list(range(len(jobs)))]
        limit = 2 * cast(FastLlama, self._fast).prefill_chunk
        fresh = [len(job.new_tokens) for job in jobs]
        passes = [[i] for i in range(len(jobs)) if fresh[i] > limit]
        group: list[int] = []
        rows = 0
        for i in sorted((i for i in range(len(jobs)) if fresh[i] <= limit), key=lambda i: fresh[i]):
            if group and rows + fresh[i] > limit:
                passes.append(group)
                group, rows = [], 0
            group.append(i)
            rows += fresh[i]
        return passes + ([group] if group else [])

    def _plan(self, request: CheckedRequest) -> _Job:
        # The last input token is always fed (its logits are needed). Positions from
        # hidden_from on are recomputed when their hidden states are asked for, unless
        # the cached entry holds states of the asked kind (the cache caps at hidden_from).
        reuse_limit = len(request.input_ids) - 1
        prefix = self.cache.lookup(request.input_ids, reuse_limit, request.hidden_from, request.feature_kind)
        sequence = np.concatenate([request.input_ids, request.draft_ids]).astype(np.int64)
        return _Job(request, prefix, sequence[prefix.length :])

    def _forward(self, jobs: list[_Job]) -> list[_RowOutput]:
        """One pass of the decoder over every job's new tokens; per-row outputs."""
        batch = len(jobs)
        if batch > 1 and self.packs_rows:
            return self._forward_packed(jobs)
        cached = [job.start for job in jobs]
        fresh = [len(job.new_tokens) for job in jobs]
        max_cached, max_fresh = max(cached), max(fresh)
        input_ids = torch.full((batch, max_fresh), PAD_TOKEN, dtype=torch.long)
        position_ids = torch.zeros((batch, max_fresh), dtype=torch.long)
        attention_mask = torch.zeros((batch, max_cached + max_fresh), dtype=torch.long)
        for b, job in enumerate(jobs):
            input_ids[b, : fresh[b]] = torch.from_numpy(job.new_tokens)
            position_ids[b] = torch.arange(cached[b], cached[b] + max_fresh)
            attention_mask[b, max_cached - cached[b] : max_cached + fresh[b]] = 1
        ragged = batch > 1 and (min(cached) != max_cached or min(fresh) != max_fresh)
        capture = self._capture(jobs)
        captured: list[torch.Tensor] = []
        buffer = None
        if self._fast is not None:
            past = self._batched_layers(jobs, max_cached)
            key_mask = attention_mask.bool() if ragged else None
            if batch == 1:  # write the new positions in place (engine/kv_buffer.py)
                buffer = KVBuffer.for_step(jobs[0].prefix.buffer, past, cached[0], fresh[0], self._num_layers,
                                           self._kv_heads, self._head_dim, self._dtype)
            hidden, new_layers, captured = self._fast.forward_capture(
                input_ids, position_ids, past, key_mask, capture, buffer)
        else:
            output = self.model.model(
                input_ids=input_ids,
                attention_mask=attention_mask if ragged else None,
                position_ids=position_ids,
                cache=self._batched_cache(jobs, max_cached),
                use_cache=True,
                output_hidden_states=bool(capture),
            )
            hidden, new_layers = output.last_hidden_state, cache_layers(output.cache)
            # transformers: hidden_states[i + 1] is the output of decoder layer i
            captured = [output.hidden_states[a + 1] for a in capture]
        self.forward_passes += 1
        self.positions_computed += sum(fresh)
        self.padded_positions += batch * max_fresh - sum(fresh)

        # hidden: float32 [batch, max_fresh, hidden]
        # Logits only where a token is decided: seq_len - 1 .. seq_len - 1 + gamma.
        first = [len(job.request.input_ids) - 1 - job.start for job in jobs]
        decision_rows = torch.cat([hidden[b, first[b] : fresh[b]] for b in range(batch)])
        logits = self._lm_head(decision_rows).float().split([job.gamma + 1 for job in jobs])
        layers = [self._row_layers(new_layers, b, batch, max_cached - cached[b], max_cached + fresh[b])
                  for b in range(batch)]
        features = [self._features(job, hidden[b, : fresh[b]], capture, [c[b, : fresh[b]] for c in captured], self._kept_kinds)
                    for b, job in enumerate(jobs)]
        return [_RowOutput(features[b], logits[b], layers[b], buffer) for b in range(batch)]

    def _forward_packed(self, jobs: list[_Job]) -> list[_RowOutput]:
        """:meth:`_forward` of several jobs on the panel kernels, packed (FastLlama.forward_packed):
        no padded rows, each job's K/V written into its own buffer."""
        fast = cast(FastLlama, self._fast)
        cached = [job.start for job in jobs]
        fresh = [len(job.new_tokens) for job in jobs]
        input_ids = torch.from_numpy(np.concatenate([job.new_tokens for job in jobs])).view(1, -1)
        position_ids = torch.cat([torch.arange(c, c + n, dtype=torch.long) for c, n in zip(cached, fresh)]).view(1, -1)
        # Each job writes into the buffer its prefix lives in when it may (KVBuffer rules);
        # two jobs continuing the same buffer at the same position (the same prefix twice)
        # must not write the same room: the second gets a copy.
        buffers: list[KVBuffer] = []
        claimed: set[int] = set()
        for job, c, n in zip(jobs, cached, fresh):
            previous = job.prefix.buffer if id(job.prefix.buffer) not in claimed else None
            buffer = KVBuffer.for_step(previous, job.prefix.layers, c, n, self._num_layers, self._kv_heads,
                                       self._head_dim, self._dtype)
            claimed.add(id(buffer))
            buffers.append(buffer)
        capture = self._capture(jobs)
        hidden, layers, captured = fast.forward_packed(input_ids, position_ids, list(zip(cached, fresh)), buffers,
                                                       capture)
        self.forward_passes += 1
        self.positions_computed += sum(fresh)
        # hidden: float32 [1, R, hidden]; job b's rows are ends[b] - fresh[b] .. ends[b] - 1
        ends = np.cumsum(fresh).tolist()
        starts = [e - n for e, n in zip(ends, fresh)]
        first = [s + len(job.request.input_ids) - 1 - job.start for s, job in zip(starts, jobs)]
        decision_rows = torch.cat([hidden[0, f:e] for f, e in zip(first, ends)])
        logits = self._lm_head(decision_rows).float().split([job.gamma + 1 for job in jobs])
        return [_RowOutput(self._features(job, hidden[0, s:e], capture, [c[0, s:e] for c in captured], self._kept_kinds),
                           logits[b], layers[b], buffers[b])
                for b, (job, s, e) in enumerate(zip(jobs, starts, ends))]

    def _capture(self, jobs: list[_Job]) -> tuple[int, ...]:
        """The decoder layers whose outputs a pass captures: those its jobs ask for and those
        of the kept kinds (none until a request asks for layer states)."""
        asked = {a for job in jobs if job.request.hidden_from >= 0 for a in job.request.hidden_layers}
        return tuple(sorted(asked.union(*self._kept_kinds)))

    @staticmethod
    def _features(job: _Job, last: torch.Tensor, capture: tuple[int, ...],
                  captured: list[torch.Tensor], kept_kinds: Sequence[FeatureKind] = ()) -> Features:
        """A job's fresh states per kind, float32 [n_new, F]: () = ``last`` (post-norm), which
        every pass computes; the kinds kept for every sequence; and, when it asked for layers,
        their outputs concatenated in its order."""
        features: Features = {(): last}
        for kind in {*kept_kinds, job.request.feature_kind}:
            if kind:
                features[kind] = torch.cat([captured[capture.index(a)] for a in kind], dim=-1)
        return features

    def _lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: float32 [rows, hidden] -> logits float32 [rows, vocab]."""
        if self._head is None:
            return self.model.lm_head(hidden)
        logits = self._head(hidden)
        bias = self.model.lm_head.bias
        return logits if bias is None else logits + bias

    def _batched_layers(self, jobs: list[_Job], max_cached: int) -> list[LayerKV] | None:
        """Each job's reused KV, left-padded to max_cached: per layer [batch, kv_heads, max_cached, head_dim]."""
        if max_cached == 0:
            return None
        if len(jobs) == 1:
            return jobs[0].prefix.layers
        num_layers = self.model.config.num_hidden_layers
        shape = (len(jobs), self._kv_heads, max_cached, self._head_dim)
        keys = [torch.zeros(shape, dtype=self._dtype) for _ in range(num_layers)]
        values = [torch.zeros(shape, dtype=self._dtype) for _ in range(num_layers)]
        for b, job in enumerate(jobs):
            if job.start == 0:
                continue
            for layer, (k, v) in enumerate(cast("list[LayerKV]", job.prefix.layers)):  # a reused prefix has its layers
                keys[layer][b, :, max_cached - job.start :] = k[0]
                values[layer][b, :, max_cached - job.start :] = v[0]
        return list(zip(keys, values))

    def _batched_cache(self, jobs: list[_Job], max_cached: int) -> DynamicCache:
        """:meth:`_batched_layers` as a transformers cache (the "transformers" kernels)."""
        layers = self._batched_layers(jobs, max_cached)
        if layers is None:
            return DynamicCache(config=self.model.config)
        return DynamicCache(ddp_cache_data=list(layers))

    @staticmethod
    def _row_layers(layers: list[LayerKV], b: int, batch: int, lo: int, hi: int) -> list[LayerKV]:
        """Sequence b's real KV, positions lo..hi-1 of the padded batch: [1, kv_heads, hi - lo, head_dim]."""
        if batch == 1:
            return layers
        # Copies, so that a stored entry does not pin the whole batch's tensors.
        return [(k[b : b + 1, :, lo:hi].clone(), v[b : b + 1, :, lo:hi].clone()) for k, v in layers]

    def _decide(self, job: _Job, row: _RowOutput) -> VerifyResult:
        """Accept/reject the draft, store the confirmed KV, cut hidden states."""
        request, draft_ids, input_length = job.request, job.request.draft_ids, len(job.request.input_ids)
        # Banned words act on the target's own logits, row by row, so plain decoding and
        # every draft see the same (banned) distribution at the same sequence.
        logits = mask_banned(row.logits, request.input_ids, draft_ids, request.bad_words)
        if request.temperature == 0:
            # numpy's argmax (first index of the maximum, like torch's): ~10x faster on [rows, vocab]
            target_tokens = logits.numpy().argmax(axis=-1)
            num_accepted = count_greedy_accepted(target_tokens, draft_ids)
            next_token = int(target_tokens[num_accepted])
        else:
            p = target_distribution(logits, request.temperature)
            if request.draft_probs is None:  # a deterministic draft: plain decoding's own draws
                outcome = coupled_sample(p, draft_ids, request.seed, input_length)
            else:
                generator = make_generator(request.seed, input_length)
                outcome = speculative_sample(p, draft_ids, request.draft_probs, generator)
            num_accepted, next_token = outcome.num_accepted, outcome.next_token
        output_ids = np.append(draft_ids[:num_accepted], next_token).astype(np.int32)
        eos_positions = np.flatnonzero(draft_ids[:num_accepted] == request.end_id)
        if request.end_id >= 0 and eos_positions.size:
            num_accepted = int(eos_positions[0])  # the EOS becomes the target's own token
            output_ids = draft_ids[: num_accepted + 1].copy()

        # Roll back: keep KV and states of input + accepted tokens only (what DynamicCache.crop does).
        kept = input_length + num_accepted
        layers = [(k[:, :, :kept], v[:, :, :kept]) for k, v in row.layers]
        features, starts = self._kept_features(job, row, kept)
        if row.buffer is not None:
            row.buffer.freeze(kept)  # the stored positions: never written again
        self.cache.store(np.concatenate([request.input_ids, draft_ids[:num_accepted]]), layers, features, row.buffer,
                         starts)

        hidden_states = None
        if request.hidden_from >= 0:
            kind = request.feature_kind  # every pass computes the asked kind: it is in ``features``
            first = starts.get(kind, 0)
            if first > request.hidden_from:  # the lookup caps reuse so that this cannot happen
                raise RuntimeError(f"states from {first} kept, asked from hidden_from {request.hidden_from}")
            rows = features[kind][request.hidden_from - first : kept - first]  # cached ones first
            hidden_states = rows.float().numpy().copy()  # a copy: the caller may write to it
        return VerifyResult(output_ids=output_ids, num_accepted=num_accepted, hidden_states=hidden_states,
                            cached_tokens=job.prefix.length)

    @staticmethod
    def _kept_features(job: _Job, row: _RowOutput, kept: int) -> tuple[Features, FeatureStarts]:
        """The states of positions s .. kept - 1 per kind, and each kind's s where it is not 0:
        the cached prefix's (from where its entry held them), then this pass's up to ``kept``
        (a rejected draft's are dropped); a kind the prefix lacks, from the first position
        this pass computed. New tensors (cat / clone): the entry pins no batch output and
        nothing writes to it later.

        () is kept for every job, asked or not: every pass computes it, it costs ~5 % of
        the KV's memory (F = hidden floats a position against 2 * layers * kv_heads *
        head_dim), and so every entry holds it: an Eagle request (hidden_from = 0 on its
        first step) reuses a prefix that a request without Eagle, or a step that asked for
        no states, cached. Kept only when asked, one such step would leave an entry, and
        every entry extending it, unusable from position 0.
        """
        fresh = kept - job.start
        features: Features = {}
        starts: FeatureStarts = {}
        for kind, states in row.features.items():
            if job.start > 0 and kind in job.prefix.features:
                features[kind] = torch.cat([job.prefix.features[kind], states[:fresh]])
                first = job.prefix.feature_from.get(kind, 0)
            else:  # fresh >= 1: the last input token is always fed
                features[kind] = states[:fresh].clone()
                first = job.start
            if first:
                starts[kind] = first
        return features, starts
