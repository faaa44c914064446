"""The verify contract between the decoding loop and a target engine.

The decoding loop never touches torch: it hands the engine a batch of
:class:`VerifyRequest` and gets back one :class:`VerifyResult` each. The same
contract is spoken three ways:

* in process, by :class:`banditspec.engine.reference.ReferenceEngine`;
* through Triton BLS, by converting to the tensors of TensorRT-LLM's
  ``tensorrt_llm`` model (:data:`TARGET_INPUTS` / :data:`TARGET_OUTPUTS`);
* by a TensorRT-LLM engine built with
  ``--speculative_decoding_mode draft_tokens_external --max_draft_len L``.

The contract is stateless: every request carries the whole sequence so far.
Engines must nevertheless not recompute a prefix they have seen (prefix KV
cache with rollback), so the cost of a call grows with the new tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol

import numpy as np


@dataclass
class VerifyRequest:
    """One verification call for one sequence.

    input_ids:   int32 [seq_len]   prompt + generated tokens so far (>= 1 token)
    draft_ids:   int32 [gamma]     proposed continuation; gamma = 0 is plain decoding
    draft_probs: float32 [gamma, vocab] or None; the drafter's distribution q for
                 each draft position (None = the draft is deterministic, q is a point mass)
    temperature: 0.0 = greedy verification, > 0 = speculative sampling
    seed:        seeds the sampling; the engine derives the randomness of a call from
                 (seed, len(input_ids)) so the result is reproducible and stateless
    end_id:      EOS id; verification stops accepting after an accepted EOS
    hidden_from: -1 = no hidden states; else also return the target's last hidden states
                 for positions hidden_from .. len(input_ids)-1+num_accepted (Eagle). A decoding
                 loop asks for 0 on its first call and len(input_ids)-1 afterwards.
    hidden_layers: which states: () = the last post-norm hidden state (EAGLE-1); else the
                 outputs of these decoder layers (residual stream, before the final norm),
                 concatenated per position in this order (EAGLE-3: low, middle, high layer).
    bad_words:   banned token sequences (:mod:`banditspec.engine.bad_words`): the token that
                 would complete one, given everything before it (draft tokens included), has
                 probability 0 at every decided position, greedy or sampled
    """

    input_ids: np.ndarray
    draft_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    draft_probs: np.ndarray | None = None
    temperature: float = 0.0
    seed: int = 0
    end_id: int = -1
    hidden_from: int = -1
    hidden_layers: tuple[int, ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class VerifyPass:
    """The engine pass a sequence was verified in, as the target measured it (the reference
    target reports it; a TensorRT-LLM target does not). Many callers' requests can share one
    pass (Triton's batcher merges what queued while the target was busy), so the time a
    caller waits for its answer says little about what a pass of R rows costs; this does.

    serial:    the pass's number at the target (wraps; tells one pass from the next)
    prefill:   the pass of new sequences (each prefills its prompt), not of decoding steps
    sequences: sequences verified in the pass
    rows:      tokens fed by all of them (each 1 + its draft)
    produced:  tokens the pass yielded (accepted draft tokens + the target's own)
    context:   the tokens before those fed, averaged over the rows fed
    seconds:   the engine's time for the pass
    longest:   the most tokens one sequence fed (a padded pass computes that many rows for each);
               0 from a target that pads nothing (packed rows) or does not say
    runner_up: the most one of the others fed (the second largest; 0 alone): what the
               longest one's pass would have been padded to without it
    deepest:   the largest context of them (cached K/V are padded to it); 0 as ``longest``
    """

    serial: int
    prefill: bool
    sequences: int
    rows: int
    produced: int
    context: float
    seconds: float
    longest: int = 0
    runner_up: int = 0
    deepest: int = 0


@dataclass
class VerifyResult:
    """What the target decided for one :class:`VerifyRequest`.

    output_ids:    int32 [n], num_accepted + 1 <= n <= gamma + 1: the accepted draft tokens,
                   then the target's own tokens: the correction at the first rejection (or
                   the bonus token when every draft token was accepted), and possibly more
                   target tokens after it. TensorRT-LLM keeps decoding until it has
                   request_output_len = gamma + 1 tokens (or EOS); those extra tokens are
                   plain decoding by the target, as valid as the rest. The reference engine
                   returns exactly num_accepted + 1.
    num_accepted:  number of draft tokens accepted (0..gamma)
    hidden_states: float32 [len(input_ids) - hidden_from + num_accepted, F] or None: the
                   target's states asked by ``hidden_layers`` (F = hidden for the last-layer,
                   post-norm LM-head input; len(hidden_layers) * hidden otherwise) at positions
                   hidden_from .. len(input_ids)-1+num_accepted; row j is the state that produced
                   the token at position hidden_from + j + 1. So its LAST num_accepted + 1 rows
                   produced output_ids, and any leading rows produced input_ids[hidden_from+1:].
    verified_in:   the pass it was verified in (:class:`VerifyPass`), where the target says
    cached_tokens: positions of input_ids whose K/V the target found in its prefix cache and did
                   not recompute, where the target says (the reference target; TensorRT-LLM
                   reports KV-cache blocks instead)
    """

    output_ids: np.ndarray
    num_accepted: int
    hidden_states: np.ndarray | None = None
    verified_in: VerifyPass | None = None
    cached_tokens: int | None = None


class Engine(Protocol):
    """A target engine. ``verify`` takes a batch so that concurrent sequences can
    share one forward pass; results come back in request order and each equals
    what the request would get alone."""

    vocab_size: int
    max_context: int  # most tokens a sequence may hold (prompt + output)
    eos_id: int
    provides_hidden_states: bool

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]: ...


# The order in which a VerifyPass travels as the target's `verify_pass` row: its fields'.
VERIFY_PASS_FIELDS = tuple(f.name for f in fields(VerifyPass))

# --- TensorRT-LLM `tensorrt_llm` model tensor contract (what BLS sends to `target`) ---
# name -> (Triton dtype, dims); dims as in config.pbtxt (batch dim excluded, max_batch_size > 0).
TARGET_INPUTS: dict[str, tuple[str, list[int]]] = {
    "input_ids": ("TYPE_INT32", [-1]),
    "input_lengths": ("TYPE_INT32", [1]),
    "request_output_len": ("TYPE_INT32", [1]),
    "draft_input_ids": ("TYPE_INT32", [-1]),
    "end_id": ("TYPE_INT32", [1]),
    "exclude_input_in_output": ("TYPE_BOOL", [1]),
    "temperature": ("TYPE_FP32", [1]),
    "seed": ("TYPE_UINT64", [1]),  # TensorRT-LLM backend name (BLS clients send `random_seed`)
    "draft_logits": ("TYPE_FP32", [-1, -1]),
    "bad_words_list": ("TYPE_INT32", [2, -1]),  # offsets form (banditspec.engine.bad_words)
}
TARGET_OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "output_ids": ("TYPE_INT32", [-1, -1]),
    "sequence_length": ("TYPE_INT32", [-1]),
}
# Reference-engine extras, requested only from a target that declares them.
REFERENCE_EXTRA_INPUTS: dict[str, tuple[str, list[int]]] = {
    "hidden_states_from": ("TYPE_INT32", [1]),
    "hidden_states_layers": ("TYPE_INT32", [-1]),
}
REFERENCE_EXTRA_OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "hidden_states": ("TYPE_FP32", [-1, -1]),
    "num_accepted_tokens": ("TYPE_INT32", [1]),
    # per row, the pass it was verified in: VERIFY_PASS_FIELDS of a VerifyPass
    "verify_pass": ("TYPE_FP64", [len(VERIFY_PASS_FIELDS)]),
    # per row, the input positions reused from the prefix cache (VerifyResult.cached_tokens)
    "cached_tokens": ("TYPE_INT32", [1]),
}
