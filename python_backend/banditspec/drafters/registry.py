"""The one drafter factory: every drafter a process serves is built here, by name.

* :func:`make_drafter`: one non-parametric drafter (``pld``, ``suffix``, ``rest``, ``copy``) with options;
* :func:`build_drafters`: the drafters of a deployment or of an in-process stack, by name:
  those four, ``eagle`` (the head in this process, the ``eagle`` Triton model through BLS,
  or a TensorRT-LLM Eagle engine), ``draft`` (a separate draft engine), and those of a
  drafter plug-in (a Python file outside the package, e.g. the tests' fault drafters).
  An arm the deployment cannot serve is left out (logged).

The helpers every drafter shares live in :mod:`banditspec.drafters.base`.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from banditspec.drafters.base import Drafter, DrafterTraits
from banditspec.errors import BanditSpecValidationError

# The one list of drafters every other list derives from.
DRAFTER_NAMES: tuple[str, ...] = ("pld", "suffix", "rest", "copy")  # non-parametric: text lookups
EAGLE = "eagle"  # the Eagle head (in process, a Triton model, or a TensorRT-LLM engine)
DRAFT_MODEL = "draft"  # a separate draft engine
# every drafter the default controller may serve as an arm, in the order arms are listed
ARM_DRAFTERS: tuple[str, ...] = ("pld", "suffix", "rest", EAGLE, "copy")
log = logging.getLogger(__name__)


def drafter_class(name: str) -> type[Drafter]:
    """The class of non-parametric drafter ``name`` (one of :data:`DRAFTER_NAMES`)."""
    if name == "pld":
        from banditspec.drafters.pld import PromptLookupDrafter

        return PromptLookupDrafter
    if name == "suffix":
        from banditspec.drafters.suffix_tree import SuffixTreeDrafter

        return SuffixTreeDrafter
    if name == "rest":
        from banditspec.drafters.rest import RestDrafter

        return RestDrafter
    if name == "copy":
        from banditspec.drafters.copy_pointer import CopyPointerDrafter

        return CopyPointerDrafter
    raise BanditSpecValidationError("arms", f"unknown drafter {name!r}; expected one of {', '.join(DRAFTER_NAMES)}")


def make_drafter(name: str, *, tokenizer: Any = None, rest_datastore: Path | None = None, **options: Any) -> Drafter:
    """A drafter shared by all requests of a process.

    name: one of :data:`DRAFTER_NAMES`. options: keyword arguments of the drafter's class
    (e.g. ``max_ngram`` for pld, ``max_depth``/``alpha`` for suffix, ``max_suffix`` for rest,
    ``ngram`` for copy).
    rest_datastore: the REST datastore folder (configuration, never a request); when None the
    default datastore is built once (needs ``tokenizer``, default: the SmolLM2 tokenizer).
    """
    factory: Any = drafter_class(name)
    if name == "rest":
        if rest_datastore is None:
            from banditspec.drafters.rest_datastore import default_datastore

            if tokenizer is None:
                from banditspec.engine.models import load_tokenizer

                tokenizer = load_tokenizer("smollm2")
            rest_datastore = default_datastore(tokenizer)
        options = {"datastore": Path(rest_datastore), **options}
    accepted = set(inspect.signature(factory).parameters)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise BanditSpecValidationError("arms", f"drafter {name!r} takes no option(s) {', '.join(unknown)}")
    return factory(**options)


def build_drafters(
    names: Sequence[str],
    tokenizer: Any,
    *,
    target_model: Any = None,
    load_target_model: Callable[[], Any] | None = None,
    target_name: str = "smollm2",
    rest_datastore: Path | None = None,
    infer: Callable | None = None,
    draft_model_name: str = "draft",
    eagle_model: str = "",
    eagle_engine: bool = False,
    eagle_head: str = "",
    eagle_probe: bool = True,
    plugin: Path | None = None,
) -> dict[str, Drafter]:
    """Drafters by name, in ``names`` order.

    ``eagle``: with ``eagle_model`` (and ``infer``), the ``eagle_model`` Triton model through
    BLS, or with ``eagle_engine`` a TensorRT-LLM Eagle engine of that name drafting like a
    draft engine; else the shipped head ``eagle_head`` ("" = the default) in this process on the target's embedding
    (``target_model``, or ``load_target_model()`` when given). Left out when none of these
    is possible, or when the shipped head does not fit the target ``target_name``. With
    ``eagle_probe``, the head's first-token probe (when its JSON has one) gives the
    controller a context for it every round without a call (banditspec.eagle.probe).
    ``draft``: a separate draft engine ``draft_model_name``, reached through ``infer``.
    ``rest``: ``rest_datastore`` or the default datastore built once into the cache folder.
    ``plugin``: a Python file that defines ``DRAFTER_NAMES`` and ``make_drafter(name)``;
    it builds the drafters of those names (configuration only, e.g. tests/fault_drafters.py).
    """
    extra = load_plugin(plugin) if plugin is not None else None
    drafters: dict[str, Drafter] = {}
    for name in names:
        drafter: Drafter | None
        if extra is not None and name in extra.DRAFTER_NAMES:
            drafter = extra.make_drafter(name)
            if not isinstance(getattr(drafter, "traits", None), DrafterTraits):
                raise BanditSpecValidationError(
                    "drafter_plugin", f"drafter {name!r} declares no traits (banditspec.drafters.base.DrafterTraits)")
        elif name == EAGLE:
            drafter = _eagle(tokenizer, target_model, load_target_model, target_name, infer, eagle_model,
                             eagle_engine, eagle_head, eagle_probe)
        elif name == DRAFT_MODEL:
            drafter = _draft_engine(infer, draft_model_name, tokenizer) if infer is not None else None
        elif name == "rest":
            from banditspec.drafters.rest_datastore import default_datastore

            path = rest_datastore if rest_datastore is not None else default_datastore(tokenizer)
            drafter = make_drafter(name, tokenizer=tokenizer, rest_datastore=path)
        else:
            drafter = make_drafter(name, tokenizer=tokenizer)
        if drafter is not None:
            drafters[name] = drafter
    return drafters


def load_plugin(path: Path) -> ModuleType:
    """The drafter plug-in in the file ``path``, executed once per process."""
    path = Path(path).resolve()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve() == path:
            return module
    if not path.is_file():
        raise BanditSpecValidationError("drafter_plugin", f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"banditspec_drafter_plugin_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise BanditSpecValidationError("drafter_plugin", f"not a Python module: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not isinstance(getattr(module, "DRAFTER_NAMES", None), tuple) or not callable(getattr(module, "make_drafter", None)):
        raise BanditSpecValidationError("drafter_plugin", f"{path} defines no DRAFTER_NAMES tuple and make_drafter(name)")
    return module


def _draft_engine(infer: Callable, model_name: str, tokenizer: Any) -> Drafter:
    from banditspec.drafters.draft_model import DraftModelDrafter

    return DraftModelDrafter(infer, model_name=model_name, end_id=int(tokenizer.eos_token_id))


def _eagle(tokenizer: Any, target_model: Any, load_target_model: Callable[[], Any] | None, target_name: str,
           infer: Callable | None, eagle_model: str, eagle_engine: bool, eagle_head: str = "",
           eagle_probe: bool = True) -> Drafter | None:
    """The eagle arm, or None when this deployment cannot serve it."""
    if eagle_model and infer is not None:
        if eagle_engine:
            # GPU: a TensorRT-LLM Eagle engine (a copy of the target with its Eagle head, drafting
            # and verifying inside) generates the proposal; `target` verifies it like any draft,
            # so the output stays the target's (docs/deploy.md, "The Eagle arm on GPU").
            return _draft_engine(infer, eagle_model, tokenizer)
        from banditspec.drafters import eagle
        from banditspec.drafters.eagle_remote import RemoteEagleDrafter
        from banditspec.eagle.probe import head_probe

        weights = eagle.head_weights(eagle_head)
        problem = eagle.head_fit_problem(target_name, weights)
        if problem is not None:  # e.g. the tiny test model
            log.warning("eagle arm not served: %s", problem)
            return None
        # the eagle model loads its head with the default window (model_repository/eagle)
        return RemoteEagleDrafter(infer, model_name=eagle_model, feature_layers=eagle.head_feature_layers(weights),
                                  prompt_window=eagle.DEFAULT_PROMPT_WINDOW,
                                  probe=head_probe(weights) if eagle_probe else None)
    if eagle_engine:
        return None  # a TensorRT-LLM target returns no hidden states to draft from here
    if target_model is None and load_target_model is not None:
        target_model = load_target_model()
    if target_model is None:
        return None  # no hidden states and no LM head here: the arm is not served
    from banditspec.drafters.eagle import head_weights, load_default_eagle_drafter

    try:
        return load_default_eagle_drafter(target_model, head_weights(eagle_head), probe=eagle_probe)
    except BanditSpecValidationError as exc:  # the shipped head is for another target
        log.warning("eagle arm not served: %s", exc)
        return None
