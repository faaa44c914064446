"""Self-distillation in parts (``banditspec build eagle --distill-parts``): part k answers the
k-th slice of the seeded prompt lists, each part is cached on its own, part 0 keeps the cache key
of every earlier build, and the validation split never draws from a later part."""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.errors import BanditSpecValidationError
from banditspec_train.eagle import dataset
from banditspec_train.eagle.corpus import CorpusSpec
from banditspec_train.eagle.features import FeatureSet
from banditspec_train.eagle.selfdistill import DistillSpec, chat_prompts, code_prompts, prompt_part
from banditspec_train.eagle.train import split_validation


@pytest.mark.long  # training tooling, not the serving path
def test_part_k_is_the_kth_slice_of_the_seeded_lists():
    first, second = prompt_part(DistillSpec(chat_prompts=4, code_prompts=3)), prompt_part(
        DistillSpec(chat_prompts=4, code_prompts=3, part=1))
    assert first == (chat_prompts(4, 0), code_prompts(3, 0))  # part 0: the lists every build answered
    assert first[0] + second[0] == chat_prompts(8, 0) and first[1] + second[1] == code_prompts(6, 0)
    assert len(second[0]) == 4 and len(second[1]) == 3
    assert not set(first[0]) & set(second[0]) and not set(first[1]) & set(second[1])
    with pytest.raises(BanditSpecValidationError, match="part"):
        DistillSpec(part=-1)


def test_part_zero_keeps_the_cache_key_of_the_builds_before_parts():
    """The shipped builds' self-distilled answers (3000 chat + 300 code, layers 1, 14, 26) are
    cached under this key; a later part is cached apart."""
    spec = DistillSpec(aux_layers=(1, 14, 26))
    assert dataset.cache_key(spec, "smollm2") == "ee7f99b957ea"
    assert dataset.cache_key(DistillSpec(aux_layers=(1, 14, 26), part=1), "smollm2") != "ee7f99b957ea"


def _answers(part: int, n: int) -> FeatureSet:
    """n one-token-id sequences of 4 positions, every id the part's number (which part it came from)."""
    return FeatureSet(tokens=np.full(4 * n, part, dtype=np.int32), features=np.zeros((4 * n, 2), np.float16),
                      offsets=np.arange(0, 4 * n + 1, 4, dtype=np.int64), loss_from=np.zeros(n, np.int32),
                      kinds=np.array(["chat"] * n))


def test_later_parts_are_cached_apart_and_never_validated(tmp_path, monkeypatch):
    monkeypatch.setenv("BANDITSPEC_CACHE", str(tmp_path))
    asked: list[int] = []

    def distill(model, tokenizer, spec, shards, progress, workers, model_name):
        asked.append(spec.part)
        return _answers(spec.part, 10)

    monkeypatch.setattr(dataset, "distill", distill)
    spec, no_text = DistillSpec(chat_prompts=8, code_prompts=2), CorpusSpec(chat_tokens=0, code_tokens=0)
    first, more, text = dataset.training_parts(None, None, "tiny", spec, no_text, progress=False, parts=3)
    assert asked == [0, 1, 2] and text is None
    assert set(first.tokens) == {0} and len(first) == 10 and sorted(set(more.tokens)) == [1, 2] and len(more) == 20
    assert len(list(tmp_path.glob("eagle-distill-tiny-*"))) == 3  # one cache per part
    again = dataset.training_parts(None, None, "tiny", spec, no_text, progress=False, parts=2)
    assert asked == [0, 1, 2] and len(again[1]) == 10  # both parts from their caches
    val, train = split_validation(first, more, 0.3, seed=0)
    assert set(val.tokens) == {0} and len(val) == 3 and len(train) == 27
    with pytest.raises(BanditSpecValidationError, match="distill_parts"):
        dataset.training_parts(None, None, "tiny", spec, no_text, progress=False, parts=0)
