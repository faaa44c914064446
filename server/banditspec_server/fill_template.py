"""Fill ``${key}`` placeholders in Triton ``config.pbtxt`` templates.

Strict on purpose: a configuration that silently keeps a ``${...}`` or drops a
misspelt key is a server that fails (or misbehaves) at load time on a GPU box.

* a key given that the template does not contain -> error naming the key;
* a placeholder left without a value -> error, unless ``optional`` maps it to a default;
* a value that would break the protobuf text (newline, double quote, backslash) -> error.

CLI (the interface shape of TensorRT-LLM's ``tools/fill_template.py``)::

    python -m banditspec_server.fill_template -i target/config.pbtxt \\
        engine_dir:/engines/target,triton_max_batch_size:8

``-i`` rewrites the file in place, otherwise the result goes to stdout. A comma inside
a value is written ``\\,`` (e.g. ``gpu_device_ids:0\\,1``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from banditspec.errors import BanditSpecValidationError

PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_FORBIDDEN_IN_VALUE = re.compile(r'["\\\x00-\x1f\x7f]')
CONFIG_FILE = "config.pbtxt"


def placeholders(text: str) -> set[str]:
    """Names of every ``${name}`` in ``text``."""
    return set(PLACEHOLDER.findall(text))


def _check_value(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise BanditSpecValidationError(key, f"value must be a string, got {type(value).__name__}")
    if _FORBIDDEN_IN_VALUE.search(value):
        raise BanditSpecValidationError(key, "value must not contain quotes, backslashes or control characters")
    return value


def fill_template(
    text: str,
    values: Mapping[str, str],
    optional: Mapping[str, str] | None = None,
) -> str:
    """``text`` with every ``${key}`` replaced by ``values[key]`` (or ``optional[key]``).

    values:   key -> value; every key must be a placeholder of ``text``
    optional: key -> default for placeholders that may be left out of ``values``;
              entries whose key is not in ``text`` are ignored (a shared defaults table)
    """
    present = placeholders(text)
    unknown = sorted(set(values) - present)
    if unknown:
        raise BanditSpecValidationError(
            unknown[0],
            f"not a placeholder of the template (unknown keys: {', '.join(unknown)}; "
            f"placeholders: {', '.join(sorted(present)) or 'none'})",
        )
    merged = {k: _check_value(k, v) for k, v in (optional or {}).items() if k in present}
    merged.update({k: _check_value(k, v) for k, v in values.items()})
    missing = sorted(present - set(merged))
    if missing:
        raise BanditSpecValidationError(missing[0], f"placeholder left unfilled (missing: {', '.join(missing)})")
    return PLACEHOLDER.sub(lambda m: merged[m.group(1)], text)


def _check_parses(text: str, where: Path) -> None:
    """Parse ``text`` as Triton's ModelConfig when tritonclient's protobuf module is present."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:  # e.g. a slim image without tritonclient: filling still works
        return
    try:
        text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise BanditSpecValidationError(str(where), f"filled config is not a valid ModelConfig: {exc}") from None


def fill_repository(
    src_dir: str | Path,
    dst_dir: str | Path,
    values_by_model: Mapping[str, Mapping[str, str]],
    optional_by_model: Mapping[str, Mapping[str, str]] | None = None,
) -> Path:
    """Copy the model repository ``src_dir`` to ``dst_dir`` and fill each model's config.pbtxt.

    values_by_model:   model folder name -> values for its config.pbtxt; a model that is
                       not in the repository is an error
    optional_by_model: model folder name -> defaults (see :func:`fill_template`)
    Symbolic links are copied as the files they point to (a dangling link is an error).
    ``dst_dir`` must not exist yet or be empty. Returns ``dst_dir``.
    """
    src, dst = Path(src_dir), Path(dst_dir)
    if not src.is_dir():
        raise BanditSpecValidationError("src_dir", f"{src} is not a directory")
    if dst.exists() and any(dst.iterdir()):
        raise BanditSpecValidationError("dst_dir", f"{dst} exists and is not empty")
    models = sorted(p.name for p in src.iterdir() if (p / CONFIG_FILE).is_file())
    unknown = sorted(set(values_by_model) - set(models))
    if unknown:
        raise BanditSpecValidationError(
            "values_by_model", f"no such model in {src}: {', '.join(unknown)} (models: {', '.join(models)})"
        )
    for link in (p for p in src.rglob("*") if p.is_symlink() and not p.exists()):
        raise BanditSpecValidationError("src_dir", f"dangling symbolic link {link}")
    shutil.copytree(src, dst, symlinks=False, dirs_exist_ok=True)
    optional_by_model = optional_by_model or {}
    for model in models:
        config = dst / model / CONFIG_FILE
        filled = fill_template(
            config.read_text(), values_by_model.get(model, {}), optional_by_model.get(model)
        )
        _check_parses(filled, config)
        config.write_text(filled)
    return dst


def parse_substitutions(text: str) -> dict[str, str]:
    """``"a:1,b:x\\,y"`` -> ``{"a": "1", "b": "x,y"}``; a key may appear once."""
    values: dict[str, str] = {}
    if not text.strip():
        return values
    for item in re.split(r"(?<!\\),", text):
        key, sep, value = item.partition(":")
        key = key.strip()
        if not sep or not key:
            raise BanditSpecValidationError("substitutions", f"expected key:value, got {item!r}")
        if key in values:
            raise BanditSpecValidationError(key, "given twice")
        values[key] = value.replace("\\,", ",")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m banditspec_server.fill_template", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("file", type=Path, help="config.pbtxt template")
    parser.add_argument("substitutions", help="key:value[,key:value...] (escape commas in values as \\,)")
    parser.add_argument("-i", "--in-place", action="store_true", help="rewrite the file instead of printing")
    parser.add_argument("--defaults", default="", help="key:value pairs used for placeholders left out")
    args = parser.parse_args(argv)
    try:
        filled = fill_template(
            args.file.read_text(), parse_substitutions(args.substitutions), parse_substitutions(args.defaults)
        )
        _check_parses(filled, args.file)
    except (BanditSpecValidationError, OSError) as exc:
        print(f"fill_template: {exc}", file=sys.stderr)
        return 2
    if args.in_place:
        args.file.write_text(filled)
    else:
        sys.stdout.write(filled)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
