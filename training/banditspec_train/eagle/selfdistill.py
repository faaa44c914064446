"""Self-distillation data: the target's own greedy answers to training prompts, with features.

The drafter is judged on the target's greedy output, so the head learns fastest from text of
that distribution (at equal tokens, a head trained on the target's answers accepts more than
one trained on ShareGPT's ChatGPT answers). Prompts are first human
turns of ShareGPT TRAIN conversations (never the eval split) and "complete this function"
requests built from Python standard-library signatures and docstrings (never HumanEval).

The target answers them greedily in left-padded batches with a KV cache. At ``precision``
"fp32" (the default) the fp32 target answers and its features are kept on the way, in one
pass; at "bf16" a bf16 copy of the target writes the answers and one forward pass of the
target under bf16 autocast (fp32 residual stream) over prompt + answer gives the features
(faster, but heads trained on it draft worse: see :class:`DistillSpec`). A row
holds the post-norm last hidden state of every prompt and answer position, and with
``aux_layers`` (EAGLE-3) the outputs of those decoder layers before it:
``[layer a_1 ; ... ; layer a_k ; last post-norm]`` (float16 [(k + 1) * H]).
"""

from __future__ import annotations

import ast
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from banditspec.errors import BanditSpecValidationError

from banditspec_train.eagle.corpus import TrainingSequence, system_prefix_len
from banditspec_train.eagle.features import FeatureSet, extract_features, layer_features, to_float16
from banditspec_train.eagle.kvcache import reserved_cache

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext

    from tqdm import tqdm

PROMPT_CHARS = 600  # longer requests are skipped (keeps batches short and fast)
LOSS_ON = ("answers", "text")
PRECISIONS = ("bf16", "fp32")
CODE_TEMPLATE = "Complete the following Python function.\n\n```python\n{code}```"


@dataclass(frozen=True)
class DistillSpec:
    chat_prompts: int = 3000
    code_prompts: int = 300
    max_new_tokens: int = 128
    batch_size: int = 64  # sequences decoded together (128 wrote a position 18 % faster than 64 in bf16, 1 thread)
    seed: int = 0
    aux_layers: tuple[int, ...] = ()  # decoder layers whose outputs are kept too (EAGLE-3)
    # "fp32": answers and features of the fp32 target, one pass (the served target's features).
    # "bf16": answers written by a bf16 copy of the target, features from one bf16-autocast
    # pass: faster with AMX, but a head trained on it drafts worse on the fp32 target's
    # answers (the cause is the answers' text, not the features' precision).
    precision: str = "fp32"
    # Which pairs count in the loss: "text" (the user's prompt and the answer, after the
    # template's system turn: how the shipped heads were trained) or "answers" (only the tokens
    # a drafter is asked for: the answer after its first token). A build on "answers" (with more
    # data, 2 epochs, 4 unrolled steps) drafted no better.
    loss_on: str = "text"
    # Which slice of the seeded prompt lists this spec answers: part k takes chat prompts
    # [k * chat_prompts, (k + 1) * chat_prompts) and code prompts likewise, so each part adds
    # prompts no other part has (a build's later parts train only: train.py --distill-parts).
    part: int = 0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise BanditSpecValidationError("precision", f"must be one of {PRECISIONS}, got {self.precision!r}")
        if self.loss_on not in LOSS_ON:
            raise BanditSpecValidationError("loss_on", f"must be one of {LOSS_ON}, got {self.loss_on!r}")
        for name in ("chat_prompts", "code_prompts", "part"):
            if getattr(self, name) < 0:
                raise BanditSpecValidationError(name, "must be >= 0")
        for name in ("max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise BanditSpecValidationError(name, "must be >= 1")
        if any(int(a) < 0 for a in self.aux_layers):
            raise BanditSpecValidationError("aux_layers", f"layer indices must be >= 0, got {self.aux_layers}")


def chat_prompts(count: int, seed: int) -> list[str]:
    from banditspec.datasets import sharegpt_split

    conversations = [c for c in sharegpt_split("train") if c and c[0][0] == "human"]
    random.Random(seed + 3).shuffle(conversations)
    out: list[str] = []
    for conversation in conversations:
        if len(out) == count:
            break
        text = conversation[0][1].strip()
        if 10 <= len(text) <= PROMPT_CHARS:
            out.append(text)
    return out


def _function_stubs(source: str) -> list[str]:
    """``def`` line(s) + docstring of every documented function of a module's source."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines()
    stubs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node):
            doc = node.body[0]
            first, last = node.lineno - 1, doc.end_lineno
            indent = len(lines[first]) - len(lines[first].lstrip())
            stub = "\n".join(line[indent:] for line in lines[first:last]) + "\n"
            if len(stub) <= PROMPT_CHARS:
                stubs.append(stub)
    return stubs


def code_prompts(count: int, seed: int) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py"))
    files = [p for p in files if "test" not in p.parts[-2] and not p.name.startswith("test")]
    rng = random.Random(seed + 4)
    stubs = [s for p in files for s in _function_stubs(p.read_text(encoding="utf-8", errors="replace"))]
    rng.shuffle(stubs)
    return [CODE_TEMPLATE.format(code=s) for s in stubs[:count]]


def prompt_part(spec: DistillSpec) -> tuple[list[str], list[str]]:
    """(chat, code) prompts of ``spec.part``: the seeded lists are prefix-stable (a longer list
    starts with the shorter one), so part k is the k-th slice of ``spec``'s counts."""
    c, k, p = spec.chat_prompts, spec.code_prompts, spec.part
    return chat_prompts((p + 1) * c, spec.seed)[p * c:], code_prompts((p + 1) * k, spec.seed)[p * k:]


def encode_prompts(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """Prompt ids exactly as the server builds them (one user turn in the chat template)."""
    from banditspec.text import prompt_ids

    return [prompt_ids(tokenizer, p, chat=True) for p in prompts]


@torch.inference_mode()
def _greedy(model: Any, prompts: list[list[int]], max_new_tokens: int, eos_id: int, pad_id: int,
            bf16: bool, aux_layers: tuple[int, ...] | None) -> tuple[list[list[int]], list[np.ndarray] | None]:
    """Greedy answers of a batch (left-padded, one KV cache); with ``aux_layers`` (not None)
    also every position's :func:`.features.layer_features` row, float16. The model may hold
    bf16 weights (its LM head then takes its own dtype)."""
    batch, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = reserved_cache(model.config, width + max_new_tokens)
    keep = aux_layers is not None
    wants = bool(aux_layers)
    features: list[list[torch.Tensor]] = [[] for _ in prompts]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        output = model.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             cache=cache, use_cache=True, output_hidden_states=wants)
        if keep:
            rows = layer_features(output, aux_layers or ())
            features = [[rows[row, width - len(p):]] for row, p in enumerate(prompts)]
        answers: list[list[int]] = [[] for _ in prompts]
        token = model.lm_head(output.last_hidden_state[:, -1]).argmax(-1)
        last_position = positions[:, -1:]
        live = list(range(batch))  # the prompts still in the batch, by batch row
        for _ in range(max_new_tokens):
            ended = []
            for row, prompt in enumerate(live):
                answers[prompt].append(int(token[row]))
                if int(token[row]) == eos_id:
                    ended.append(row)
            if not keep and len(ended) == len(live):
                break  # no answer's last feature is needed
            mask = torch.cat([mask, torch.ones((len(live), 1), dtype=torch.long)], dim=1)
            last_position = last_position + 1
            output = model.model(input_ids=token[:, None], attention_mask=mask, position_ids=last_position,
                                 cache=cache, use_cache=True, output_hidden_states=wants)
            if keep:
                rows = layer_features(output, aux_layers or ())[:, -1]
                for row, prompt in enumerate(live):
                    features[prompt].append(rows[row: row + 1])
            token = model.lm_head(output.last_hidden_state[:, -1]).argmax(-1)
            if ended:  # an answer that ended has its last feature now: its row leaves the batch
                kept = torch.tensor(sorted(set(range(len(live))) - set(ended)), dtype=torch.long)
                if len(kept) == 0:
                    break
                cache.batch_select_indices(kept)
                mask, last_position, token = mask[kept], last_position[kept], token[kept]
                live = [live[r] for r in kept.tolist()]
    sequences = [list(p) + a for p, a in zip(prompts, answers)]
    return sequences, [to_float16(torch.cat(f)) for f in features] if keep else None


def greedy_with_features(model: Any, prompts: list[list[int]], max_new_tokens: int, eos_id: int,
                         pad_id: int, bf16: bool = False,
                         aux_layers: tuple[int, ...] = ()) -> list[tuple[list[int], np.ndarray]]:
    """Greedy answers of a batch; per prompt (prompt + answer ids, float16 [len, F] features,
    F = (len(aux_layers) + 1) * H, see :func:`.features.layer_features`), in one pass.

    An answer ends after EOS or ``max_new_tokens``; every token of it, the last included, has
    its feature (the batch feeds it once more)."""
    sequences, features = _greedy(model, prompts, max_new_tokens, eos_id, pad_id, bf16, tuple(aux_layers))
    assert features is not None
    return list(zip(sequences, features))


def greedy_answers(model: Any, prompts: list[list[int]], max_new_tokens: int, eos_id: int,
                   pad_id: int) -> list[list[int]]:
    """Prompt + greedy answer ids of a batch (no features), as :func:`greedy_with_features`."""
    return _greedy(model, prompts, max_new_tokens, eos_id, pad_id, False, None)[0]


def bf16_copy(model: Any) -> Any:
    """The target with bf16 weights, for writing answers fast (AMX / AVX512-BF16 matmuls)."""
    import copy

    return copy.deepcopy(model).to(torch.bfloat16)


def answer_batch(model: Any, generator: Any, spec: DistillSpec, prompts: list[list[int]], eos_id: int,
                 pad_id: int) -> list[tuple[list[int], np.ndarray]]:
    """(ids, float16 features) per prompt of one batch, at ``spec.precision``.

    "fp32": :func:`greedy_with_features` with the fp32 target (``generator`` unused).
    "bf16": ``generator`` (:func:`bf16_copy`) writes the answers, then one forward pass of the
    target under bf16 autocast over prompt + answer gives every feature
    (:func:`.features.extract_features`): faster than "fp32" where the CPU has AMX; the
    answers are the bf16 target's,
    and the features differ from fp32's by 0.8 % with the same LM-head argmax at 99.5 % of
    positions, yet a head trained on them drafts worse (docs/benchmarks/history.md)."""
    aux = tuple(spec.aux_layers)
    if spec.precision == "fp32":
        return greedy_with_features(model, prompts, spec.max_new_tokens, eos_id, pad_id, aux_layers=aux)
    sequences = greedy_answers(generator, prompts, spec.max_new_tokens, eos_id, pad_id)
    fs = extract_features(model, [TrainingSequence(s, 0, "chat") for s in sequences], batch_tokens=4096,
                          progress=False, bf16=True, aux_layers=aux)
    return [(s, fs.sequence(i)[1]) for i, s in enumerate(sequences)]


def _plan(tokenizer: Any, spec: DistillSpec) -> tuple[list[list[int]], list[str], list[list[int]]]:
    """(encoded prompts, their kinds, batches of prompt indices sorted by length)."""
    chats, codes = prompt_part(spec)
    texts, kinds = chats + codes, ["chat"] * len(chats) + ["code"] * len(codes)
    encoded = encode_prompts(tokenizer, texts)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    batches = [order[i:i + spec.batch_size] for i in range(0, len(order), spec.batch_size)]
    return encoded, kinds, batches


class BatchQueue:
    """Batch numbers handed to whichever worker asks first, each exactly once, the longest
    prompts first (batches are sorted by prompt length): the workers finish together instead
    of one waiting for the other's last, longest batches. Counters shared between processes."""

    def __init__(self, count: int, context: BaseContext) -> None:
        self.count = count
        self._next = context.Value("i", 0)
        self._finished = context.Value("i", 0)

    def claim(self) -> int | None:
        with self._next.get_lock():
            k = self._next.value
            self._next.value = k + 1
        return None if k >= self.count else self.count - 1 - k

    def finish(self) -> None:
        with self._finished.get_lock():
            self._finished.value += 1

    @property
    def finished(self) -> int:
        return int(self._finished.value)


def _answer_batches(model: Any, tokenizer: Any, spec: DistillSpec, encoded: list[list[int]], batches: list[list[int]],
                    shard_dir: Path | None, queue: BatchQueue, bar: tqdm | None = None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Answer the batches this process claims from ``queue`` (skipping finished shards); their
    results. ``bar`` (tqdm): shows every worker's finished batches."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    generator = bf16_copy(model) if spec.precision == "bf16" else None
    while (number := queue.claim()) is not None:
        batch = batches[number]
        shard = shard_dir / f"batch-{number:05d}.npz" if shard_dir is not None else None
        if shard is None or not shard.exists():
            outputs = answer_batch(model, generator, spec, [encoded[i] for i in batch], eos, pad)
            for i, (tokens, feats) in zip(batch, outputs):
                results[i] = (np.asarray(tokens, dtype=np.int32), feats)
            if shard is not None:
                lengths = [len(results[i][0]) for i in batch]
                tmp = shard.with_name(shard.stem + ".tmp.npz")
                np.savez(tmp, index=np.asarray(batch), offsets=np.concatenate([[0], np.cumsum(lengths)]),
                         tokens=np.concatenate([results[i][0] for i in batch]),
                         features=np.concatenate([results[i][1] for i in batch]))
                tmp.rename(shard)
        queue.finish()
        if bar is not None:
            bar.update(queue.finished - bar.n)
    return results


def loss_starts(spec: DistillSpec, prompt_lengths: list[int], prefix: int) -> np.ndarray:
    """First pair index in the loss per sequence. Pair i predicts token i + 2 (EAGLE-3: pair i =
    (E[x_{i+1}], g_i)), so the first answer token a drafter can be asked for (x_{P+1}: x_P, the
    answer's first token, comes from the prefill) is pair P - 1 for a prompt of P tokens."""
    if spec.loss_on == "text":
        return np.full(len(prompt_lengths), prefix, dtype=np.int32)
    return np.asarray([max(0, n - 1) for n in prompt_lengths], dtype=np.int32)


def _worker_main(model_name: str, spec: DistillSpec, shard_dir: Path, queue: BatchQueue) -> None:
    """A spawned worker process: one torch thread, the batches it claims, into shards."""
    from banditspec.engine.models import load_model

    torch.set_num_threads(1)
    model, tokenizer = load_model(model_name)
    encoded, _, batches = _plan(tokenizer, spec)
    _answer_batches(model, tokenizer, spec, encoded, batches, shard_dir, queue)


def distill(model: Any, tokenizer: Any, spec: DistillSpec, shard_dir: Path | None = None,
            progress: bool = True, workers: int = 1, model_name: str | None = None) -> FeatureSet:
    """Self-distillation FeatureSet; each finished batch is a shard a later call resumes from.

    ``workers`` > 1 (with ``shard_dir`` and ``model_name``): that many processes of one torch
    thread each (this one included) answer the batches, each claiming the next one when free
    (:class:`BatchQueue`). On a small CPU shared with other work, single-thread processes keep
    going where a multi-thread one stalls at every parallel region waiting for a descheduled
    thread."""
    import multiprocessing

    from tqdm import tqdm

    encoded, kinds, batches = _plan(tokenizer, spec)
    prefix = system_prefix_len(tokenizer)
    if shard_dir is not None:
        shard_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, int(workers)) if shard_dir is not None and model_name else 1
    children = []
    context = multiprocessing.get_context("spawn")
    queue = BatchQueue(len(batches), context)
    if workers > 1:
        assert shard_dir is not None and model_name is not None
        children = [context.Process(target=_worker_main, args=(model_name, spec, shard_dir, queue))
                    for _ in range(1, workers)]
        for child in children:
            child.start()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
    bar = tqdm(total=len(batches), desc="self-distillation", unit="batch", disable=not progress)
    try:
        results = _answer_batches(model, tokenizer, spec, encoded, batches, shard_dir, queue, bar)
        for child in children:
            while child.is_alive():  # the others' last batches
                child.join(timeout=2.0)
                bar.update(queue.finished - bar.n)
            if child.exitcode != 0:
                raise RuntimeError(f"self-distillation worker failed (exit code {child.exitcode})")
    finally:
        bar.close()
        for child in children:
            if child.is_alive():
                child.terminate()
        if workers > 1:
            torch.set_num_threads(threads)
    for number in range(len(batches)):  # the batches other workers (or an earlier call) answered
        shard = shard_dir / f"batch-{number:05d}.npz" if shard_dir is not None else None
        if shard is None or not shard.exists() or batches[number][0] in results:
            continue
        with np.load(shard) as data:
            rows = np.split(np.arange(len(data["tokens"])), data["offsets"][1:-1])
            for i, r in zip(data["index"], rows):
                results[int(i)] = (data["tokens"][r], data["features"][r])
    assert len(results) == len(encoded), "every prompt answered"
    indices = sorted(results)
    lengths = [len(results[i][0]) for i in indices]
    return FeatureSet(
        tokens=np.concatenate([results[i][0] for i in indices]),
        features=np.concatenate([results[i][1] for i in indices]),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        loss_from=loss_starts(spec, [len(encoded[i]) for i in indices], prefix),
        kinds=np.asarray([kinds[i] for i in indices], dtype="<U4"),
    )
