"""Prometheus text exposition (Triton's :8002/metrics): scrape, parse, sum a metric's series.

The one reader of the metrics port in the client, its benchmarks and its tests."""

from __future__ import annotations

import urllib.request

Series = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Series:
    """Prometheus text format -> {name: [(labels, value)]}."""
    out: Series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, label_text = head.partition("{")
        labels = {}
        for item in label_text.rstrip("}").split('",') if label_text else []:
            key, _, val = item.partition("=")
            labels[key.strip(",")] = val.strip('"')
        out.setdefault(name, []).append((labels, float(value)))
    return out


def scrape_metrics(metrics_port: int, host: str = "localhost") -> Series:
    with urllib.request.urlopen(f"http://{host}:{metrics_port}/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode())


def metric_value(series: Series, name: str, **labels: str) -> float | None:
    """Sum of the series of ``name`` whose labels include ``labels``; None when none matches
    (the server does not export it)."""
    values = [v for lab, v in series.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    return sum(values) if values else None


def metric_total(series: Series, name: str, **labels: str) -> float:
    """Sum of the series of ``name`` whose labels include ``labels`` (0 when absent)."""
    return metric_value(series, name, **labels) or 0.0
