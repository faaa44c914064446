"""The training FeatureSet of a build, cached in the cache folder by its specification.

Self-distillation data (:mod:`.selfdistill`, the default; in parts of the seeded prompt lists,
the first validated from, the later ones trained on only) plus, optionally, fixed training
text (:mod:`.corpus`, ShareGPT train-split conversations and stdlib code) whose features come
from one extra target pass (:mod:`.features`). Interrupted builds resume from shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from banditspec.errors import BanditSpecValidationError
from banditspec.paths import cache_dir

from banditspec_train.eagle.corpus import CorpusSpec, build_corpus
from banditspec_train.eagle.features import FeatureSet, extract_features, load_features, save_features
from banditspec_train.eagle.selfdistill import DistillSpec, distill

log = logging.getLogger(__name__)


def concat(sets: list[FeatureSet]) -> FeatureSet:
    """One FeatureSet of ``sets`` in order; a lone non-empty set is returned as it is (a part
    of self-distilled answers is ~2.6 GB: no copy where nothing is joined)."""
    sets = [s for s in sets if len(s)]
    if len(sets) == 1:
        return sets[0]
    lengths = np.concatenate([np.diff(s.offsets) for s in sets])
    return FeatureSet(
        tokens=np.concatenate([s.tokens for s in sets]),
        features=np.concatenate([s.features for s in sets]),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        loss_from=np.concatenate([s.loss_from for s in sets]),
        kinds=np.concatenate([s.kinds for s in sets]),
    )


def cache_key(spec: DistillSpec | CorpusSpec, model_name: str) -> str:
    fields = asdict(spec)
    if fields.get("part") == 0:  # part 0 keeps the key it had before parts existed: its caches stay valid
        del fields["part"]
    return hashlib.sha256(json.dumps([model_name, type(spec).__name__, fields]).encode()).hexdigest()[:12]


def _cached(name: str, spec: DistillSpec | CorpusSpec, model_name: str,
            build: Callable[[Path], FeatureSet]) -> FeatureSet:
    key = cache_key(spec, model_name)
    folder = cache_dir() / f"eagle-{name}-{model_name}-{key}"
    cached = load_features(folder)
    if cached is not None:
        log.info("using cached %s", folder)
        return cached
    shards = folder.with_name(folder.name + ".shards")  # an interrupted build resumes from here
    fs = build(shards)
    save_features(fs, folder)
    shutil.rmtree(shards, ignore_errors=True)
    return fs


def training_parts(model: Any, tokenizer: Any, model_name: str, distill_spec: DistillSpec,
                   text_spec: CorpusSpec, progress: bool = True, workers: int = 1,
                   parts: int = 1) -> tuple[FeatureSet | None, FeatureSet | None, FeatureSet | None]:
    """(self-distilled answers of ``distill_spec``'s part, those of the ``parts - 1`` parts after
    it, fixed text), each None when not requested; each part is cached on its own. ``workers``:
    self-distillation processes (one torch thread each), see :func:`.selfdistill.distill`.
    Fixed text gets the layers of ``text_spec.aux_layers`` too, from one bf16-autocast pass
    (the features' precision does not change what a head learns)."""
    if parts < 1:
        raise BanditSpecValidationError("distill_parts", f"must be >= 1, got {parts}")
    distilled = more = text = None
    if distill_spec.chat_prompts + distill_spec.code_prompts > 0:
        answered = []
        for k in range(distill_spec.part, distill_spec.part + parts):
            spec = replace(distill_spec, part=k)
            answered.append(_cached("distill", spec, model_name,
                                    partial(distill, model, tokenizer, spec, progress=progress,
                                            workers=workers, model_name=model_name)))
        distilled, more = answered[0], (concat(answered[1:]) if len(answered) > 1 else None)
    if text_spec.chat_tokens + text_spec.code_tokens > 0:
        text = _cached("text", text_spec, model_name, lambda shards: extract_features(
            model, build_corpus(tokenizer, text_spec), progress=progress, shard_dir=shards,
            aux_layers=text_spec.aux_layers))
    if distilled is None and text is None:
        raise BanditSpecValidationError("chat_prompts", "no training data requested")
    return distilled, more, text


def training_data(model: Any, tokenizer: Any, model_name: str, distill_spec: DistillSpec,
                  text_spec: CorpusSpec, progress: bool = True, workers: int = 1, parts: int = 1) -> FeatureSet:
    """Every part of :func:`training_parts` in one set."""
    return concat([p for p in training_parts(model, tokenizer, model_name, distill_spec, text_spec,
                                             progress, workers, parts) if p is not None])
