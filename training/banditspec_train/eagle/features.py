"""Target features for training, computed once and kept in the cache folder.

The feature of position i is what the reference engine returns as ``hidden_states``: the
post-norm last hidden state of ``model.model(...)`` (the LM-head input). A feature set is
a folder of .npy files:

    tokens.npy    int32   [N]      all sequences concatenated
    features.npy  float16 [N, H]   f_i for every token position (fp16 to halve the disk)
    offsets.npy   int64   [S + 1]  sequence s is rows offsets[s] .. offsets[s+1]-1
    loss_from.npy int32   [S]      first pair index of a sequence that counts in the loss
    kinds.npy     <U4     [S]      "chat" | "code"
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from banditspec_train.eagle.corpus import TrainingSequence


@dataclass
class FeatureSet:
    tokens: np.ndarray
    features: np.ndarray
    offsets: np.ndarray
    loss_from: np.ndarray
    kinds: np.ndarray

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def sequence(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """(token ids int32 [T], features float16 [T, H]) of sequence s."""
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        return self.tokens[a:b], self.features[a:b]

    def subset(self, indices: Sequence[int]) -> FeatureSet:
        parts = [self.sequence(int(s)) for s in indices]
        lengths = [len(t) for t, _ in parts]
        return FeatureSet(
            tokens=np.concatenate([t for t, _ in parts]),
            features=np.concatenate([f for _, f in parts]),
            offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            loss_from=self.loss_from[list(indices)],
            kinds=self.kinds[list(indices)],
        )


FILES = ("tokens", "features", "offsets", "loss_from", "kinds")


def save_features(fs: FeatureSet, folder: Path) -> None:
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in FILES:
        np.save(tmp / f"{name}.npy", getattr(fs, name))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def load_features(folder: Path) -> FeatureSet | None:
    if not all((folder / f"{name}.npy").exists() for name in FILES):
        return None
    return FeatureSet(**{name: np.load(folder / f"{name}.npy") for name in FILES})


def layer_features(output: Any, aux_layers: tuple[int, ...]) -> torch.Tensor:
    """float32 [B, T, (len(aux_layers) + 1) * H] from a ``model.model`` output: the given decoder
    layers' outputs, then the post-norm last hidden state. transformers' ``hidden_states[0]`` is
    the embedding output, ``hidden_states[i + 1]`` the output of decoder layer i (before the
    final norm)."""
    last = output.last_hidden_state.float()
    if not aux_layers:
        return last
    states = output.hidden_states
    return torch.cat([states[a + 1].float() for a in aux_layers] + [last], dim=-1)


def to_float16(features: torch.Tensor) -> np.ndarray:
    """float16 rows; the residual stream's rare large entries (~2.5e4 here) are clamped so none overflows."""
    return features.clamp(-65000, 65000).to(torch.float16).numpy()


@torch.inference_mode()
def extract_features(model: Any, sequences: list[TrainingSequence], batch_tokens: int = 1024,
                     progress: bool = True, bf16: bool = True,
                     shard_dir: Path | None = None, shard_tokens: int = 16384,
                     aux_layers: tuple[int, ...] = ()) -> FeatureSet:
    """Run the target over every sequence (right-padded batches of similar length); a row is
    :func:`layer_features` (the last post-norm state alone without ``aux_layers``).

    ``bf16``: matmuls under CPU bf16 autocast (fp32 residual stream; measured on SmolLM2 with
    AMX: 3.2x faster than fp32, features 0.8 % off fp32's (relative norm), the LM head's argmax
    the same at 99.5 % of positions).
    ``shard_dir``: finished batches are saved there every ``shard_tokens`` tokens, and a
    later call with the same sequences resumes from them.
    """
    from tqdm import tqdm

    features: list[np.ndarray | None] = [None] * len(sequences)
    if shard_dir is not None:
        shard_dir.mkdir(parents=True, exist_ok=True)
        for shard in sorted(shard_dir.glob("shard-*.npz")):
            with np.load(shard) as data:
                for s, a, b in zip(data["index"], data["offsets"][:-1], data["offsets"][1:]):
                    features[int(s)] = data["features"][a:b]
    order = sorted((s for s in range(len(sequences)) if features[s] is None),
                   key=lambda s: len(sequences[s].token_ids))
    bar = tqdm(total=sum(len(s.token_ids) for s in sequences), unit="tok",
               desc="target features", disable=not progress)
    bar.update(sum(len(f) for f in features if f is not None))
    unsaved: list[int] = []
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order):
            longest = len(sequences[order[stop]].token_ids)
            if longest * (stop + 1 - start) > batch_tokens:
                break
            stop += 1
        batch = order[start:stop]
        width = max(len(sequences[s].token_ids) for s in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        for row, s in enumerate(batch):
            seq = sequences[s].token_ids
            ids[row, : len(seq)] = torch.tensor(seq)
        # right padding never reaches earlier positions through causal attention
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            rows = layer_features(model.model(input_ids=ids, output_hidden_states=bool(aux_layers)), aux_layers)
        for row, s in enumerate(batch):
            n = len(sequences[s].token_ids)
            features[s] = to_float16(rows[row, :n])
            bar.update(n)
        unsaved += batch
        start = stop
        if shard_dir is not None and (start == len(order) or
                                      sum(len(f) for f in _computed(features, unsaved)) >= shard_tokens):
            _save_shard(shard_dir, unsaved, features)
            unsaved = []
    bar.close()
    lengths = [len(s.token_ids) for s in sequences]
    return FeatureSet(
        tokens=np.concatenate([np.asarray(s.token_ids, dtype=np.int32) for s in sequences]),
        features=np.concatenate(_computed(features, range(len(sequences)))),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        loss_from=np.asarray([s.loss_from for s in sequences], dtype=np.int32),
        kinds=np.asarray([s.kind for s in sequences], dtype="<U4"),
    )


def _computed(features: list[np.ndarray | None], indices: Iterable[int]) -> list[np.ndarray]:
    """The rows of sequences ``indices``, every one of which has its features by now."""
    rows = []
    for s in indices:
        f = features[s]
        assert f is not None, f"sequence {s} has no features"
        rows.append(f)
    return rows


def _save_shard(shard_dir: Path, indices: list[int], features: list[np.ndarray | None]) -> None:
    parts = _computed(features, indices)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    number = len(list(shard_dir.glob("shard-*.npz")))
    tmp = shard_dir / f"tmp-{number:05d}.npz"
    np.savez(tmp, index=np.asarray(indices, dtype=np.int64), offsets=offsets,
             features=np.concatenate(parts))
    tmp.rename(shard_dir / f"shard-{number:05d}.npz")
