"""The Triton models' configuration: their ``config.pbtxt`` parameters (strings), read once
into typed, validated dataclasses. Every error names the parameter.

* :class:`ServingConfig`      the ``banditspec`` model (controller, drafters, limits, metrics)
* :class:`TargetModelConfig`  the ``target`` model (reference engine)
* :class:`EagleModelConfig`   the ``eagle`` model (the Eagle head as a service)

Paths and models come only from here, never from a request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from banditspec.bandits.cost_model import check_batch_pricing
from banditspec.bandits.registry import check_policy
from banditspec.config import DEFAULT_MAX_DRAFT_LEN, DEFAULT_POLICY, REWARD_CHOICES, Limits
from banditspec.decoding.bookkeeping import check_bookkeeping
from banditspec.drafters.registry import DRAFTER_NAMES
from banditspec.eagle import check_eagle_head
from banditspec.errors import BanditSpecValidationError
from banditspec.serving.admission import AdmissionLimits

TARGET_KINDS = ("reference", "tensorrtllm")
# The default admission queue holds this many waiting requests per sequence slot.
QUEUE_PER_SEQUENCE = 4


def model_parameters(args: Mapping[str, str]) -> dict[str, str]:
    """A Triton Python model's ``parameters`` (name -> string value) from its ``initialize`` args."""
    config = json.loads(args["model_config"])
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


class Parameters:
    """Typed reads of string parameters; a missing one takes the default, a malformed one
    raises BanditSpecValidationError naming it."""

    def __init__(self, params: Mapping[str, str]):
        self._params = params

    def text(self, key: str, default: str) -> str:
        return str(self._params.get(key, default))

    def integer(self, key: str, default: int, low: int | None = None) -> int:
        return int(self._parse(key, default, int, "an integer", low))

    def number(self, key: str, default: float, low: float | None = None, unit: str = "") -> float:
        return float(self._parse(key, default, float, "a number" + unit, low))

    def _parse(self, key: str, default: float, convert: Callable[[str], float], what: str, low: float | None) -> float:
        raw = self._params.get(key)
        if raw is None:
            return default
        try:
            value = convert(raw)
        except (TypeError, ValueError):
            raise BanditSpecValidationError(key, f"parameter must be {what}, got {raw!r}") from None
        if low is not None and value < low:
            raise BanditSpecValidationError(key, f"must be >= {low:g}, got {value}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        raw = self._params.get(key)
        if raw is None:
            return default
        value = str(raw).strip().lower()
        if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise BanditSpecValidationError(key, f"must be true or false, got {raw!r}")
        return value in ("1", "true", "yes", "on")

    def names(self, key: str, default: str) -> tuple[str, ...]:
        """A comma-separated list, blanks dropped."""
        return tuple(x.strip() for x in self.text(key, default).split(",") if x.strip())


ParameterSource = Union["ServingConfig", Mapping[str, str]]


@dataclass(frozen=True)
class ServingDefaults:
    """What a request that names none of these gets, and how many are served at once: the
    ``banditspec`` model's parameters ``default_policy``, ``default_arms``,
    ``default_max_draft_len``, ``default_reward``, ``chat_template``,
    ``max_concurrent_sequences``, ``max_queue_size``, ``max_queue_wait_s``."""

    policy: str = DEFAULT_POLICY
    arms: tuple[str, ...] | None = None  # None = every arm the deployment serves
    max_draft_len: int = DEFAULT_MAX_DRAFT_LEN
    reward: str = "accepted"
    chat_template: bool = True
    max_concurrent_sequences: int = 8
    # Requests beyond max_concurrent_sequences wait (first come, first served) in a queue of
    # max_queue_size (default QUEUE_PER_SEQUENCE x max_concurrent_sequences) for at most
    # max_queue_wait_s; only a full queue or an expired wait is refused, with a retry-after
    # (banditspec.serving.admission).
    max_queue_size: int = 32
    max_queue_wait_s: float = 60.0

    def admission_limits(self) -> AdmissionLimits:
        return AdmissionLimits(self.max_concurrent_sequences, self.max_queue_size, self.max_queue_wait_s)


@dataclass(frozen=True)
class ServingConfig:
    """The ``banditspec`` model's parameters (defaults: what a missing parameter means)."""

    target_model: str = "smollm2"  # the checkpoint: tokenizer, and the in-process Eagle head's embedding
    target_kind: str = "reference"  # reference | tensorrtllm
    target_name: str = "target"  # the Triton model that verifies
    tokenizer_dir: str = ""  # "": the target checkpoint's tokenizer
    max_context: int = 2048
    drafters: tuple[str, ...] = DRAFTER_NAMES  # the in-process drafters; eagle comes with eagle_model
    eagle_model: str = ""  # the Triton model of the Eagle head; "": in this process
    eagle_head: str = ""  # the shipped head: "" (default) | eagle1 | eagle3; the eagle model's must match
    eagle_probe: bool = True  # the head's first-token probe as the controller's context (banditspec.eagle.probe)
    rest_datastore: Path | None = None  # None: the default datastore
    draft_name: str = "draft"  # the Triton model of a separate draft engine
    drafter_plugin: Path | None = None  # a file that adds drafters by name (tests only)
    defaults: ServingDefaults = ServingDefaults()
    limits: Limits = field(default_factory=lambda: Limits(max_prompt_tokens=1536))
    drafter_deadline_s: float = 0.5
    gamma_controller: str = "off"  # off | ucb | fixed:<K> (banditspec.gamma_controller.budgets)
    gamma_controller_max: int = 4
    batch_pricing: str = "packed"  # packed | rows | padded (banditspec.bandits.cost_model.BatchCost)
    metrics: bool = True
    metrics_log_interval_s: float = 60.0  # 0: no summary log line
    gc_freeze: bool = True  # freeze the loaded heap out of the garbage collector's walks (banditspec.serving.heap)
    # when a costaware step's learning runs: "background" (while the target verifies the next
    # round) | "deferred" | "now" (within the step) (banditspec.decoding.bookkeeping)
    bookkeeping: str = "background"
    # Reference target: concurrent sequences' steps go out as one request of up to
    # verify_max_rows rows (the target's max_batch_size), a step waiting at most
    # verify_gather_us for the others (0: a request per step; banditspec.engine.gather).
    verify_gather_us: int = 2000
    verify_max_rows: int = 16

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> ServingConfig:
        p = Parameters(params)
        target_kind = p.text("target_kind", "reference")
        if target_kind not in TARGET_KINDS:
            raise BanditSpecValidationError("target_kind", f"must be one of {TARGET_KINDS}")
        datastore = p.text("rest_datastore", "default")
        default_reward = p.text("default_reward", "accepted")
        max_concurrent = p.integer("max_concurrent_sequences", 8, low=1)
        if default_reward not in REWARD_CHOICES:
            raise BanditSpecValidationError("default_reward", f"unknown reward {default_reward!r}; choose from {REWARD_CHOICES}")
        return cls(
            target_model=p.text("target_model", "smollm2"),
            target_kind=target_kind,
            target_name=p.text("target_name", "target"),
            tokenizer_dir=p.text("tokenizer_dir", ""),
            max_context=p.integer("max_context", 2048, low=1),
            drafters=p.names("drafters", ",".join(DRAFTER_NAMES)),
            eagle_model=p.text("eagle_model", "").strip(),
            eagle_head=check_eagle_head(p.text("eagle_head", "")),
            eagle_probe=p.flag("eagle_probe", True),
            rest_datastore=None if datastore in ("", "default") else Path(datastore),
            draft_name=p.text("draft_name", "draft"),
            drafter_plugin=Path(plugin) if (plugin := p.text("drafter_plugin", "").strip()) else None,
            defaults=ServingDefaults(
                policy=check_policy(p.text("default_policy", DEFAULT_POLICY), field="default_policy"),
                arms=p.names("default_arms", "") or None,
                max_draft_len=p.integer("default_max_draft_len", DEFAULT_MAX_DRAFT_LEN),
                reward=default_reward,
                chat_template=p.flag("chat_template", True),
                max_concurrent_sequences=max_concurrent,
                max_queue_size=p.integer("max_queue_size", 0, low=0) if p.text("max_queue_size", "").strip()
                else QUEUE_PER_SEQUENCE * max_concurrent,  # "" or absent: the default
                max_queue_wait_s=p.number("max_queue_wait_s", 60.0, low=0.001, unit=" of seconds"),
            ),
            limits=Limits(
                max_tokens=p.integer("max_tokens_limit", 1024),
                max_prompt_tokens=p.integer("max_prompt_tokens", 1536),
                max_stop_words=p.integer("max_stop_words", 16),
                max_draft_len=p.integer("max_draft_len_limit", 16),
            ),
            drafter_deadline_s=p.integer("drafter_deadline_ms", 500) / 1000.0,
            gamma_controller=p.text("gamma_controller", "off"),
            gamma_controller_max=p.integer("gamma_controller_max", 4),
            batch_pricing=check_batch_pricing(p.text("batch_pricing", "packed")),
            metrics=p.flag("metrics", True),
            metrics_log_interval_s=p.number("metrics_log_interval_s", 60.0, low=0, unit=" of seconds"),
            gc_freeze=p.flag("gc_freeze", True),
            bookkeeping=check_bookkeeping(p.text("bookkeeping", "background")),
            verify_gather_us=p.integer("verify_gather_us", 2000, low=0),
            verify_max_rows=p.integer("verify_max_rows", 16, low=1),
        )

    @classmethod
    def of(cls, source: ParameterSource) -> ServingConfig:
        """``source`` itself, or read from a parameter mapping."""
        return source if isinstance(source, ServingConfig) else cls.from_parameters(source)


@dataclass(frozen=True)
class TargetModelConfig:
    """The ``target`` model's parameters (reference engine)."""

    target_model: str = "smollm2"
    max_context: int = 2048
    cache_entries: int = 16
    torch_threads: int = 0  # 0: torch's default
    kernels: str = "fast"  # fast (panel, bitwise exact) | onednn | transformers (fp32) | int8 (not exact)
    gc_freeze: bool = True  # freeze the loaded heap out of the garbage collector's walks (banditspec.serving.heap)
    # new sequences' pass first, and each request answered as soon as its rows are verified
    # (not when the whole batch is): a new request's first token does not wait for the others' step
    answer_early: bool = True

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> TargetModelConfig:
        p = Parameters(params)
        return cls(
            target_model=p.text("target_model", "smollm2"),
            max_context=p.integer("max_context", 2048, low=1),
            cache_entries=p.integer("cache_entries", 16),
            torch_threads=p.integer("torch_threads", 0),
            kernels=p.text("kernels", "fast"),
            gc_freeze=p.flag("gc_freeze", True),
            answer_early=p.flag("answer_early", True),
        )


@dataclass(frozen=True)
class EagleModelConfig:
    """The ``eagle`` model's parameters (the Eagle head as a service)."""

    target_model: str = "smollm2"
    max_sequences: int = 64
    max_draft_len_limit: int = 16
    min_confidence: float | None = None  # None (absent or ""): the head's own tuned cut-off
    eagle_head: str = ""  # "" (default) | eagle1 | eagle3: the shipped head served
    torch_threads: int = 1
    gc_freeze: bool = True  # freeze the loaded heap out of the garbage collector's walks (banditspec.serving.heap)

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> EagleModelConfig:
        p = Parameters(params)
        raw_confidence = params.get("min_confidence")
        return cls(
            target_model=p.text("target_model", "smollm2"),
            max_sequences=p.integer("max_sequences", 64),
            max_draft_len_limit=p.integer("max_draft_len_limit", 16),
            min_confidence=None if raw_confidence in (None, "") else p.number("min_confidence", 0.0),
            torch_threads=p.integer("torch_threads", 1),
            eagle_head=check_eagle_head(p.text("eagle_head", "")),
            gc_freeze=p.flag("gc_freeze", True),
        )

