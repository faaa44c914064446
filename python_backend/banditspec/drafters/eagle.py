"""Drafter ``eagle``: chain drafting with a trained Eagle head (EAGLE-3, or the older EAGLE-1).

A session keeps the head's KV cache over the *real* pairs (f_i, x_{i+1}) only, i.e. the
target's features from ``observe`` (EAGLE-3: the outputs of the target's low, middle and
high decoder layers, fused by the head's ``fc``; EAGLE-1: the last post-norm state).
``propose`` (and ``preview``) first feed the pairs that arrived since the last call (one
small prefill); ``preview`` then scores the first token only (the costaware controller asks
for it every round, so the catch-up stays a few positions long); ``propose`` drafts token by token, feeding back its own state and drafted token; those
speculative cache entries are dropped when ``propose`` returns. So after a rejection nothing needs undoing: the next ``propose``
continues from the real features the target returned for the accepted tokens, and the state
equals a fresh session over the same tokens.

The session needs the target's hidden states (``VerifyRequest.hidden_from`` >= 0). When a
step came without them and a gap in the features is left, the session stops proposing
(empty drafts) for the rest of the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from banditspec.checks import is_int
from banditspec.drafters.base import Draft, DrafterTraits, Preview, first_feature
from banditspec.eagle import EAGLE1_WEIGHTS, EAGLE3_WEIGHTS, EAGLE_HEADS, check_eagle_head
from banditspec.eagle.fast_step import FastEagleStep, KVBuffer
from banditspec.eagle.head import EagleHead, load_head
from banditspec.eagle.head3 import Eagle3Head, head_format, head_info, load_head3
from banditspec.eagle.probe import FirstTokenProbe, head_probe
from banditspec.engine.fast_llama import Int8Linear
from banditspec.errors import BanditSpecValidationError

# The served head: EAGLE-3, which accepts more tokens a step than EAGLE-1 and, as costaware's
# arm, is chosen far more often on chat; its dearer pulls earn back their cost there and
# are level elsewhere (docs/eagle.md, "Which head"). EAGLE-1 ships too (eagle_head: eagle1).
DEFAULT_WEIGHTS = EAGLE3_WEIGHTS
HEADS = dict(zip(EAGLE_HEADS, (EAGLE1_WEIGHTS, EAGLE3_WEIGHTS)))


def head_weights(name: str = "") -> Path:
    """The weights of a shipped head by name ("" = the default, "eagle1", "eagle3")."""
    name = check_eagle_head(name or "")
    return HEADS[name] if name else DEFAULT_WEIGHTS


# see EagleDrafter; chosen by experiments/eagle/tune_confidence.py. A head's JSON may carry
# its own tuned "min_confidence", which then wins.
DEFAULT_MIN_CONFIDENCE = 0.4
# The head drafts with int8 weights (per output row, fbgemm's dynamic linear): a drafted token
# streams ~4x fewer bytes. Drafts are verified, so the head's precision changes only which
# tokens are proposed, never the output (experiments/eagle/bench_eagle.py --precision compares
# acceptance). EAGLE-3's feature projection ``fc`` stays fp32 (EagleDrafter.__init__).
DEFAULT_INT8 = True
# The head reads at most this many of the prompt's latest positions: feeding it a whole prompt
# costs a head forward over every prompt position on the first pull, while the head's attention
# is mostly local, so acceptance does not change. The target is asked for those states only, so
# a cached prompt prefix is reused up to the window. None: the whole prompt.
DEFAULT_PROMPT_WINDOW: int | None = 64
# When a session is asked to draft with more than this many real pairs not yet fed to the head
# (costaware pulls the head in a few rounds out of many, so the pairs of every round since pile
# up), it starts its cache afresh on the latest ones instead: the same relative-rope argument as
# the prompt window, and a catch-up of at most this many pairs, so a late pull stays cheap with
# acceptance unchanged (experiments/eagle/catchup_window_study.py). None: feed every pair.
DEFAULT_CATCHUP_WINDOW: int | None = 16
# Whether the costaware controller asks the head for a preview (its first token and its
# probability) every round, and so chooses it with its confidence as context, never pulls it
# to see it decline, and learns its first token's acceptance every round. Off by default: a
# preview costs the head's catch-up plus its LM head every round (weights cold after a target
# forward), about what the better choices gain with these heads; pulled blind, the head costs
# only in the rounds that choose it (experiments/ab_previews.py). Sessions offer preview()
# either way.
DEFAULT_PREVIEWS = False


class _Int8Module(torch.nn.Module):
    """An ``nn.Linear`` for inference with int8 weights (drafting only)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.linear = Int8Linear(linear.weight)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return y if self.bias is None else y + self.bias


def int8_head(head: EagleHead | Eagle3Head) -> EagleHead | Eagle3Head:
    """A copy of ``head`` whose linear layers run with int8 weights."""
    import copy

    quantized = copy.deepcopy(head)
    for parent in list(quantized.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, _Int8Module(child))
    return quantized.eval()


class EagleDrafter:
    """Shared, read-only: the head and the target's embedding matrix.

    embedding: float32 [target_vocab, hidden] (the target's tied embedding / LM head).
    stop_ids: drafting stops after proposing one of these (e.g. EOS).
    min_confidence: drafting stops before a token whose probability under the head (softmax
        over the draft vocabulary) is below this, so that an unsure head proposes fewer
        tokens (possibly none) and the target verifies less; 0 always drafts the full length.
    int8: draft with int8 weights (see DEFAULT_INT8); False: the head as given (fp32).
    prompt_window: the head reads only the prompt's latest ``prompt_window`` positions (and
        every position after them); None: the whole prompt. The decoding loop asks the target
        for those positions' states alone (:func:`~banditspec.drafters.base.first_feature`).
    catchup_window: a session asked to draft with more real pairs pending than this restarts
        its cache on the latest ``catchup_window`` of them (see DEFAULT_CATCHUP_WINDOW); its
        first catch-up, the prompt's, feeds up to ``prompt_window`` of them
        (:attr:`EagleSession.catchup_limit`); None: it feeds them all.
    previews: the costaware controller previews the head every round (see DEFAULT_PREVIEWS).
    probe: the head's first-token probe (banditspec.eagle.probe), or None: sessions then
        offer no ``hint()`` and the controller pulls the head blind.
    """

    name = "eagle"

    def __init__(self, head: EagleHead | Eagle3Head, embedding: torch.Tensor, stop_ids: Sequence[int] = (),
                 min_confidence: float = 0.0, int8: bool = False, prompt_window: int | None = None,
                 previews: bool = False, probe: FirstTokenProbe | None = None,
                 catchup_window: int | None = None):
        if not 0.0 <= float(min_confidence) < 1.0:
            raise BanditSpecValidationError("min_confidence", f"must be in [0, 1), got {min_confidence!r}")
        for field, window in (("prompt_window", prompt_window), ("catchup_window", catchup_window)):
            if window is not None and not (is_int(window) and window >= 1):
                raise BanditSpecValidationError(field, f"must be None or an int >= 1, got {window!r}")
        self.catchup_window = catchup_window
        self.min_confidence = float(min_confidence)
        cfg = head.config
        if embedding.ndim != 2 or tuple(embedding.shape) != (cfg.target_vocab_size, cfg.hidden_size):
            raise BanditSpecValidationError(
                "embedding", f"expected shape {(cfg.target_vocab_size, cfg.hidden_size)}, "
                f"got {tuple(embedding.shape)}")
        self.int8 = bool(int8)
        # What runs the head's layer while drafting: a fused runner with its own (int8) weights
        # (same math, faster at a few positions, one C call when the kernels load:
        # eagle/fast_step.py), for both formats. The head stays as given (its config; EAGLE-1's
        # LM head in fp32 drafting; other drafters may be built from it)
        self.head: EagleHead | Eagle3Head = head.eval()
        self.stepper = FastEagleStep(self.head, self.int8)
        # EAGLE-3's own projection of the target's layers and its LM head run outside that layer.
        # The projection stays fp32 even when drafting in int8: Int8Linear quantizes a call's
        # input with one scale, and fc's input is the target's layers side by side, whose
        # magnitudes differ by ~500x (layer 26's outlier channels reach ~480, layer 1's typical
        # value is ~0.8), so int8 rounds most of the low layer to zero; with fc in fp32 the head
        # accepts what it accepts in fp32. It runs
        # on the real pairs of a catch-up only, never per drafted token.
        self._project: torch.nn.Module | None = None
        self._lm_head: torch.nn.Module | None = None
        if isinstance(head, Eagle3Head):
            self._project = head.fc
            self._lm_head = _Int8Module(head.lm_head) if self.int8 else head.lm_head
        self.embedding = embedding.detach().to(torch.float32)
        self.draft_vocab = head.draft_vocab.to(torch.int64)
        # EAGLE-1 scores drafts with the target's own LM-head rows; EAGLE-3 has its own LM head
        self.lm_rows = None if isinstance(head, Eagle3Head) else self.embedding[self.draft_vocab].contiguous()  # [K, H]
        self._lm_int8 = Int8Linear(self.lm_rows) if self.int8 and self.lm_rows is not None else None
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        # Proposed on the calling thread (runs_inline): bounded compute in this process (one
        # small prefill, then at most gamma head steps), no I/O that could hang, and the
        # hand-off to the deadline thread would cost a good share of a proposal. A call slower
        # than the deadline still drops the arm afterwards. (The remote head keeps the thread.)
        # feature_layers: which target states a step must return; () = the last one.
        self.traits = DrafterTraits(
            costly=True, needs_hidden_states=True, runs_inline=True, previews=bool(previews), prompt_window=prompt_window,
            feature_layers=tuple(head.config.aux_layers) if isinstance(head, Eagle3Head) else ())
        if probe is not None and probe.feature_size != self.feature_size:
            raise BanditSpecValidationError(
                "first_token_probe", f"reads rows of {probe.feature_size}, the head's features have {self.feature_size}")
        self.probe = probe

    @property
    def prompt_window(self) -> int | None:
        return self.traits.prompt_window

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.traits.feature_layers

    def step(self, embeddings: torch.Tensor, features: torch.Tensor, cache: KVBuffer) -> torch.Tensor:
        """Run the head over T pairs appended to ``cache`` (a session's, from ``new_cache``)."""
        return self.stepper.step(embeddings, features, cache)

    def new_cache(self) -> KVBuffer:
        return self.stepper.new_cache()

    @property
    def hidden_size(self) -> int:
        return self.head.config.hidden_size

    @property
    def feature_size(self) -> int:
        """Width of one position's target feature row (hidden, or k layers * hidden)."""
        return self.head.config.feature_size if isinstance(self.head, Eagle3Head) else self.hidden_size

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [K] of the head's state [.., H] for the next token."""
        if isinstance(self.head, Eagle3Head):
            assert self._lm_head is not None
            return self._lm_head(self.head.norm(state.reshape(-1)))  # Eagle3Head.logits
        assert self.lm_rows is not None
        if self._lm_int8 is not None:
            return self._lm_int8(state.reshape(1, -1)).reshape(-1)
        return self.head.draft_logits(state.reshape(-1), self.lm_rows)

    def real_input(self, features: torch.Tensor) -> torch.Tensor:
        """The head's hidden input for real target features [1, T, F]."""
        return features if self._project is None else self._project(features)  # Eagle3Head.project

    @property
    def vocab_size(self) -> int:
        return self.head.config.target_vocab_size

    def start(self, prompt_ids: Sequence[int] | np.ndarray) -> EagleSession:
        return EagleSession(self, prompt_ids)


class EagleSession:
    """Per-request state: tokens, real features not yet fed to the head, the head's KV cache."""

    def __init__(self, drafter: EagleDrafter, prompt_ids: Sequence[int] | np.ndarray):
        self.drafter = drafter
        self.tokens: list[int] = []
        self._append_tokens(prompt_ids, "prompt_ids")
        if not self.tokens:
            raise BanditSpecValidationError("prompt_ids", "must hold at least one token")
        # The head reads positions from first_feature on (the prompt's window; rope is relative,
        # so it sees them as the end of a longer context); earlier rows are dropped on arrival.
        self.first_feature = first_feature(len(self.tokens), drafter.prompt_window)
        self.num_features = self.first_feature  # positions first_feature .. num_features-1 have f_i
        self.pending: list[torch.Tensor] = []  # features of positions committed .. num_features-1
        self.cache: KVBuffer = drafter.new_cache()  # real pairs first_feature .. committed-1
        self.committed = self.first_feature
        self._last_predicted: torch.Tensor | None = None  # f^ after the last real pair
        self._first: tuple[int, int, float] | None = None  # (committed, token, confidence) of the last preview
        self._last_row: np.ndarray | None = None  # the target's latest feature row (the probe's input)
        self.closed = False

    # --- protocol --------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, max_len: int) -> Draft:
        if max_len <= 0 or self.closed or not self.can_draft:
            return Draft()
        drafter = self.drafter
        predicted = self._commit_pending()  # f^ of the next position, [1, 1, H]
        proposed: list[int] = []
        real = self.cache.length  # drafted pairs go past it and are forgotten on return
        embedding = self.drafter.embedding
        first = self._first if self._first is not None and self._first[0] == self.committed else None
        while True:
            if first is not None:  # scored by preview() at this very state
                (_, token, confidence), first = first, None
            else:
                token, confidence = self._argmax(predicted)
            if confidence < self.drafter.min_confidence:
                break
            proposed.append(token)
            if len(proposed) >= max_len or token in self.drafter.stop_ids:
                break
            predicted = drafter.step(embedding[token].view(1, 1, -1), predicted, self.cache)[:, -1:]
        self.cache.truncate(real)
        return Draft(token_ids=np.asarray(proposed, dtype=np.int32))

    @torch.inference_mode()
    def preview(self) -> Preview | None:
        """The first token ``propose`` would draft now and the head's probability of it;
        None when the session cannot draft (no features yet, a gap, closed)."""
        if self.closed or not self.can_draft:
            return None
        predicted = self._commit_pending()
        if self._first is None or self._first[0] != self.committed:
            token, confidence = self._argmax(predicted, always=True)
            self._first = (self.committed, token, confidence)
        return Preview(self._first[1], self._first[2], self.drafter.min_confidence)

    def hint(self) -> float | None:
        """The probe's P(a proposal now starts with a token the target accepts), with no head
        call (drafters.base); None without a probe; 0.0 when the session cannot draft now."""
        if self.drafter.probe is None:
            return None
        if self.closed or not self.can_draft or self._last_row is None:
            return 0.0
        return self.drafter.probe(self._last_row)

    def observe(self, new_tokens: Sequence[int] | np.ndarray, hidden_states: np.ndarray | None = None) -> None:
        if self.closed:
            return
        self._append_tokens(new_tokens, "new_tokens")
        if hidden_states is None:
            return
        rows = np.asarray(hidden_states)
        n = len(self.tokens)
        if rows.ndim != 2 or rows.shape[1] != self.drafter.feature_size or rows.shape[0] > n - 1:
            raise BanditSpecValidationError(
                "hidden_states", f"expected [<= {n - 1}, {self.drafter.feature_size}] rows, "
                f"got {list(rows.shape)}")
        if len(rows):
            self._last_row = np.array(rows[-1], dtype=np.float32)  # position n-2: produced the latest token
        first = n - 1 - rows.shape[0]  # position of the first row (rows end at position n-2)
        if first > self.num_features:
            return  # a gap: features of positions num_features .. first-1 never came
        fresh = rows[self.num_features - first:]
        if len(fresh):
            self.pending.append(torch.from_numpy(np.ascontiguousarray(fresh, dtype=np.float32)))
            self.num_features += len(fresh)

    def close(self, finished: bool) -> None:
        self.closed = True
        self.pending.clear()
        self.cache = self.drafter.new_cache()  # frees the cache: a closed session never drafts

    # --- internals -------------------------------------------------------------------
    @property
    def cache_k(self) -> torch.Tensor:
        """The real pairs' keys in the head's cache [1, nkv, pairs, d] (committed - first_feature
        until a catch-up past the window restarts it)."""
        return self.cache.k[:, :, : self.cache.length]

    @property
    def cache_v(self) -> torch.Tensor:
        return self.cache.v[:, :, : self.cache.length]

    @property
    def can_draft(self) -> bool:
        """Features of every position but the last: f_first .. f_{n-2} with n tokens."""
        return self.num_features > self.first_feature and self.num_features == len(self.tokens) - 1

    @property
    def catchup_limit(self) -> int | None:
        """The most pending pairs the next catch-up feeds (the latest ones; None: all). The
        first one feeds the prompt's window: the catch-up window bounds the pairs that piled up
        between pulls, and cut to it the first draft would read 16 prompt positions, not 64."""
        drafter = self.drafter
        if drafter.catchup_window is None or self.committed > self.first_feature:
            return drafter.catchup_window
        if drafter.prompt_window is None:
            return None
        return max(drafter.catchup_window, drafter.prompt_window)

    def _append_tokens(self, ids: Sequence[int] | np.ndarray, field: str) -> None:
        values = [int(t) for t in ids]
        vocab = self.drafter.vocab_size
        if any(t < 0 or t >= vocab for t in values):
            raise BanditSpecValidationError(field, f"token ids must lie in [0, {vocab})")
        self.tokens.extend(values)

    def _commit_pending(self) -> torch.Tensor:
        """Feed real pairs committed .. num_features-1 into the cache (or, past the catch-up
        window, only the latest ones into a fresh cache); f^ of the last one."""
        emb_matrix = self.drafter.embedding
        if self.pending:
            features = torch.cat(self.pending).unsqueeze(0)  # [1, T, H]
            start, window = self.committed, self.catchup_limit
            if window is not None and features.shape[1] > window:
                # too many to catch up on: the latest `window` pairs become the whole context
                features, start = features[:, -window:], self.num_features - window
                self.cache = self.drafter.new_cache()
            next_tokens = torch.tensor(self.tokens[start + 1: self.num_features + 1])
            predicted = self.drafter.step(
                emb_matrix[next_tokens].unsqueeze(0), self.drafter.real_input(features), self.cache)
            self.pending = []
            self.committed = self.num_features
            self._last_predicted = predicted[:, -1:]
        assert self._last_predicted is not None, "a session drafts only once it has features"
        return self._last_predicted

    def _argmax(self, predicted: torch.Tensor, always: bool = False) -> tuple[int, float]:
        """(target id of the head's top draft token, its probability; 1.0 when not needed
        unless ``always``)."""
        logits = self.drafter.logits(predicted)
        best = int(logits.argmax())
        confidence = 1.0
        if always or self.drafter.min_confidence > 0:
            confidence = float(torch.softmax(logits, dim=-1)[best])
        return int(self.drafter.draft_vocab[best]), confidence


def load_eagle_head(weights: Path) -> EagleHead | Eagle3Head:
    """The head saved in ``weights`` (EAGLE-3 or EAGLE-1, told by the JSON beside it)."""
    if not Path(weights).with_suffix(".json").exists():
        raise BanditSpecValidationError("eagle_weights", f"no such head: {Path(weights).name}")
    return load_head3(weights) if head_format(weights) == "eagle3" else load_head(weights)


def head_min_confidence(weights: Path = DEFAULT_WEIGHTS) -> float:
    """The confidence cut-off tuned for the head in ``weights`` (its JSON), else the default."""
    return float(head_info(weights).get("min_confidence", DEFAULT_MIN_CONFIDENCE))


def head_feature_layers(weights: Path = DEFAULT_WEIGHTS) -> tuple[int, ...]:
    """The target layers the head in ``weights`` reads (() = the last post-norm state); from
    its JSON, so a controller that reaches the head remotely asks the target for the right states."""
    info = head_info(weights)
    if info.get("format", "eagle1") != "eagle3":
        return ()
    return tuple(int(a) for a in info["config"]["aux_layers"])


def load_default_eagle_drafter(target_model: Any, weights: Path = DEFAULT_WEIGHTS,
                               min_confidence: float | None = None, int8: bool = DEFAULT_INT8,
                               prompt_window: int | None = DEFAULT_PROMPT_WINDOW,
                               previews: bool = DEFAULT_PREVIEWS, probe: bool = True,
                               catchup_window: int | None = DEFAULT_CATCHUP_WINDOW) -> EagleDrafter:
    """The shipped head for SmolLM2-135M-Instruct, on ``target_model``'s (frozen) embedding.
    ``min_confidence`` None: the head's own tuned cut-off (:func:`head_min_confidence`);
    ``probe``: with the head's first-token probe when its JSON has one."""
    if min_confidence is None:
        min_confidence = head_min_confidence(weights)
    head = load_eagle_head(weights)
    cfg, target = head.config, target_model.config
    if (cfg.hidden_size, cfg.target_vocab_size) != (target.hidden_size, target.vocab_size):
        raise BanditSpecValidationError(
            "eagle_weights", f"head built for hidden {cfg.hidden_size} / vocab "
            f"{cfg.target_vocab_size}, target has {target.hidden_size} / {target.vocab_size}")
    embedding = target_model.get_input_embeddings().weight.detach().float()
    eos = target.eos_token_id
    stop_ids = eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
    return EagleDrafter(head, embedding, stop_ids=stop_ids, min_confidence=min_confidence, int8=int8,
                        prompt_window=prompt_window, previews=previews, probe=head_probe(weights) if probe else None,
                        catchup_window=catchup_window)


def head_fit_problem(target_name: str, weights: Path = DEFAULT_WEIGHTS) -> str | None:
    """Why the head in ``weights`` cannot draft for the target checkpoint ``target_name``
    (hidden size / vocabulary differ), or None when it fits. Reads configs only."""
    import json

    from banditspec.engine.models import model_dir

    head_cfg = head_info(weights)["config"]
    target_cfg = json.loads((model_dir(target_name) / "config.json").read_text())
    head_shape = (int(head_cfg["hidden_size"]), int(head_cfg["target_vocab_size"]))
    target_shape = (int(target_cfg["hidden_size"]), int(target_cfg["vocab_size"]))
    if head_shape != target_shape:
        return (f"head built for hidden {head_shape[0]} / vocab {head_shape[1]}, "
                f"target {target_name} has {target_shape[0]} / {target_shape[1]}")
    return None
