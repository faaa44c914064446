"""The benchmarks' one reporting stack: tables (Markdown, console) and PNG figures (matplotlib).

Every bench command renders its tables with :func:`markdown_table` (reports written to files)
or :func:`text_row` (lines printed as results arrive) and its figures with :func:`pyplot` and
:func:`save_png`; what a command reports (its summaries) lives with the command.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

MISSING = "–"
_ALIGN = {"l": "---", "r": "---:", "c": ":---:"}


def fmt(value: float | None, pattern: str = "{:.2f}", missing: str = MISSING) -> str:
    """``value`` formatted with ``pattern``; ``missing`` when there is none."""
    return missing if value is None else pattern.format(value)


def markdown_row(cells: Sequence[object]) -> str:
    """``| a | b |``; an empty cell is ``| |``."""
    return "|" + "|".join(f" {c} " if str(c) != "" else " " for c in cells) + "|"


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A Markdown table. ``align``: one letter per column, l (default), r or c."""
    align = align.ljust(len(header), "l")
    lines = [markdown_row(header), "|" + "|".join(_ALIGN[a] for a in align) + "|"]
    lines += [markdown_row(row) for row in rows]
    return "\n".join(lines)


def text_row(cells: Sequence[object], widths: Sequence[str]) -> str:
    """One line of a console table: each cell padded by its format spec (e.g. ``"<8"``,
    ``">9.1f"``), cells separated by one space."""
    return " ".join(format(c, w) for c, w in zip(cells, widths))


def text_header(names: Sequence[str], widths: Sequence[str]) -> str:
    """The header line of a :func:`text_row` table (number formats reduced to the width)."""
    return text_row(names, [w.split(".")[0].rstrip("dfegs%") for w in widths])


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Lay ``fig`` out, write it to ``path`` as PNG and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
