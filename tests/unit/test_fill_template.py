"""The config.pbtxt template filler: strict about keys, safe about values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from banditspec.errors import BanditSpecValidationError
from banditspec_server.fill_template import (
    fill_repository,
    fill_template,
    main,
    parse_substitutions,
    placeholders,
)

TEMPLATE = """name: "m"
backend: "python"
max_batch_size: ${batch}
parameters: { key: "path" value: { string_value: "${engine_dir}" } }
parameters: { key: "again" value: { string_value: "${batch}" } }
"""


def test_fills_every_occurrence():
    out = fill_template(TEMPLATE, {"batch": "8", "engine_dir": "/e/target"})
    assert "${" not in out
    assert "max_batch_size: 8\n" in out
    assert 'string_value: "/e/target"' in out
    assert out.count('"8"') == 1  # the second ${batch}


def test_placeholders_found():
    assert placeholders(TEMPLATE) == {"batch", "engine_dir"}
    assert placeholders("no placeholders, $notone, ${1bad}") == set()


def test_unknown_key_fails_and_names_it():
    with pytest.raises(BanditSpecValidationError) as err:
        fill_template(TEMPLATE, {"batch": "8", "engine_dir": "/e", "engin_dir": "/typo"})
    assert err.value.field == "engin_dir"
    assert str(err.value).startswith("engin_dir:")


def test_unfilled_placeholder_fails_and_names_it():
    with pytest.raises(BanditSpecValidationError) as err:
        fill_template(TEMPLATE, {"batch": "8"})
    assert err.value.field == "engine_dir"


def test_optional_default_used_and_overridden():
    defaults = {"engine_dir": "/default", "not_in_this_template": "x"}
    assert 'string_value: "/default"' in fill_template(TEMPLATE, {"batch": "1"}, defaults)
    assert 'string_value: "/given"' in fill_template(TEMPLATE, {"batch": "1", "engine_dir": "/given"}, defaults)


@pytest.mark.parametrize("bad", ['a"b', "a\nb", "a\\b", "a\x00b"])
def test_values_that_would_break_the_config_are_rejected(bad):
    with pytest.raises(BanditSpecValidationError) as err:
        fill_template(TEMPLATE, {"batch": "1", "engine_dir": bad})
    assert err.value.field == "engine_dir"


def test_non_string_value_rejected():
    with pytest.raises(BanditSpecValidationError) as err:
        fill_template(TEMPLATE, {"batch": 8, "engine_dir": "/e"})  # type: ignore[dict-item]
    assert err.value.field == "batch"


def test_no_recursive_substitution():
    out = fill_template(TEMPLATE, {"batch": "1", "engine_dir": "${batch}"})
    assert 'string_value: "${batch}"' in out


def test_parse_substitutions():
    assert parse_substitutions("a:1,b:x\\,y,c:http://h:80") == {"a": "1", "b": "x,y", "c": "http://h:80"}
    assert parse_substitutions("") == {}
    with pytest.raises(BanditSpecValidationError):
        parse_substitutions("a:1,nocolon")
    with pytest.raises(BanditSpecValidationError) as err:
        parse_substitutions("a:1,a:2")
    assert err.value.field == "a"


def test_cli_in_place_and_stdout(tmp_path, capsys):
    cfg = tmp_path / "config.pbtxt"
    cfg.write_text(TEMPLATE)
    assert main([str(cfg), "batch:4,engine_dir:/e"]) == 0
    assert "max_batch_size: 4" in capsys.readouterr().out
    assert cfg.read_text() == TEMPLATE  # stdout mode leaves the file alone
    assert main(["-i", str(cfg), "batch:4", "--defaults", "engine_dir:/d"]) == 0
    assert 'string_value: "/d"' in cfg.read_text()


def test_cli_unknown_key_exits_2_and_keeps_file(tmp_path, capsys):
    cfg = tmp_path / "config.pbtxt"
    cfg.write_text(TEMPLATE)
    assert main(["-i", str(cfg), "batch:4,engine_dir:/e,bogus:1"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert cfg.read_text() == TEMPLATE


def test_cli_runs_as_module(tmp_path):
    cfg = tmp_path / "config.pbtxt"
    cfg.write_text(TEMPLATE)
    proc = subprocess.run(
        [sys.executable, "-m", "banditspec_server.fill_template", "-i", str(cfg), "batch:2,engine_dir:/x"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "max_batch_size: 2" in cfg.read_text()


def test_cli_rejects_a_filled_config_that_does_not_parse(tmp_path, capsys):
    cfg = tmp_path / "config.pbtxt"
    cfg.write_text(TEMPLATE)
    assert main(["-i", str(cfg), "batch:eight,engine_dir:/e"]) == 2
    assert "ModelConfig" in capsys.readouterr().err


def _make_repository(root: Path) -> Path:
    src = root / "src"
    (src / "a" / "1").mkdir(parents=True)
    (src / "a" / "config.pbtxt").write_text(TEMPLATE.replace('"m"', '"a"'))
    (src / "b" / "1").mkdir(parents=True)
    (src / "b" / "config.pbtxt").write_text('name: "b"\nbackend: "python"\nmax_batch_size: 1\n')
    shared = root / "shared_model.py"
    shared.write_text("# the one model.py\n")
    os.symlink(shared, src / "b" / "1" / "model.py")
    return src


def test_fill_repository_copies_fills_and_dereferences_links(tmp_path):
    src = _make_repository(tmp_path)
    dst = fill_repository(src, tmp_path / "dst", {"a": {"batch": "3", "engine_dir": "/e/a"}})
    assert "max_batch_size: 3" in (dst / "a" / "config.pbtxt").read_text()
    assert (dst / "b" / "config.pbtxt").read_text() == (src / "b" / "config.pbtxt").read_text()
    copied = dst / "b" / "1" / "model.py"
    assert not copied.is_symlink() and copied.read_text() == "# the one model.py\n"
    assert "${" in (src / "a" / "config.pbtxt").read_text()  # the source is untouched


def test_fill_repository_unknown_model_fails(tmp_path):
    src = _make_repository(tmp_path)
    with pytest.raises(BanditSpecValidationError) as err:
        fill_repository(src, tmp_path / "dst", {"a": {"batch": "1", "engine_dir": "/e"}, "c": {}})
    assert err.value.field == "values_by_model" and "c" in str(err.value)


def test_fill_repository_missing_values_fail(tmp_path):
    src = _make_repository(tmp_path)
    with pytest.raises(BanditSpecValidationError) as err:
        fill_repository(src, tmp_path / "dst", {})
    assert err.value.field == "batch"


def test_fill_repository_refuses_non_empty_destination(tmp_path):
    src = _make_repository(tmp_path)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "stale").write_text("x")
    with pytest.raises(BanditSpecValidationError) as err:
        fill_repository(src, dst, {"a": {"batch": "1", "engine_dir": "/e"}})
    assert err.value.field == "dst_dir"


def test_fill_repository_dangling_link_fails(tmp_path):
    src = _make_repository(tmp_path)
    os.symlink(tmp_path / "missing.py", src / "a" / "1" / "model.py")
    with pytest.raises(BanditSpecValidationError) as err:
        fill_repository(src, tmp_path / "dst", {"a": {"batch": "1", "engine_dir": "/e"}})
    assert "dangling" in str(err.value)
