"""Where generated artefacts (converted weights, datastores, tiny models) live.

Everything generated goes under one cache folder, ``<checkout>/.cache/banditspec``
by default (git-ignored), or ``$BANDITSPEC_CACHE`` when set.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """The cache folder, created on first use."""
    path = Path(os.environ.get("BANDITSPEC_CACHE", REPO_ROOT / ".cache" / "banditspec"))
    path.mkdir(parents=True, exist_ok=True)
    return path
