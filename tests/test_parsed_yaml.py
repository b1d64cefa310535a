"""The parsed copies of the preset directories (``topologies/``, ``runtimes/``): current, equal
to what PyYAML reads, and never used for a file whose text differs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parosim.errors import InputError
from parosim.io.yamlspec import PARSED_NAME, parsed_entries, parsed_text, read_yaml, write_parsed

ROOT = Path(__file__).resolve().parents[1]
DIRS = [ROOT / "topologies", ROOT / "runtimes"]


@pytest.mark.parametrize("d", DIRS, ids=lambda d: d.name)
def test_parsed_copy_is_current_and_complete(d):
    """The committed copy is what ``python -m parosim.io.yamlspec`` writes today, with an
    entry for every YAML file (run that command after editing a preset)."""
    assert (d / PARSED_NAME).read_text(encoding="utf-8") == parsed_text(d), (
        f"{d.name}/{PARSED_NAME} is stale: run python -m parosim.io.yamlspec")
    files = json.loads((d / PARSED_NAME).read_text(encoding="utf-8"))["files"]
    assert sorted(files) == sorted(f.name for f in d.glob("*.yaml"))


@pytest.mark.parametrize("d", DIRS, ids=lambda d: d.name)
def test_parsed_copy_equals_pyyaml(d):
    for f in sorted(d.glob("*.yaml")):
        fast = read_yaml(f, "preset")
        slow = read_yaml(f, "preset", parsed_copy=False)
        assert json.dumps(fast) == json.dumps(slow)   # same keys, order, types and values
        assert repr(fast) == repr(slow)


def test_edited_file_is_parsed_again(tmp_path):
    shutil.copy(ROOT / "topologies" / "paper-a100-roce.yaml", tmp_path / "p.yaml")
    write_parsed(tmp_path)
    assert read_yaml(tmp_path / "p.yaml", "cluster")["name"] == "paper-a100-roce"
    text = (tmp_path / "p.yaml").read_text()
    (tmp_path / "p.yaml").write_text(text.replace("name: paper-a100-roce", "name: edited"))
    assert read_yaml(tmp_path / "p.yaml", "cluster")["name"] == "edited"
    # an edit that breaks the file is reported as before, not hidden by the copy
    (tmp_path / "p.yaml").write_text(text + "name: twice\n")
    with pytest.raises(InputError, match="duplicate key 'name'"):
        read_yaml(tmp_path / "p.yaml", "cluster")


def test_copy_is_used_only_for_its_exact_text(tmp_path):
    """A copy whose entry was tampered with is used only while the text matches: the entry's
    data is what read_yaml returns then, so the check is on the text, not the name."""
    (tmp_path / "a.yaml").write_text("x: 1\n")
    write_parsed(tmp_path)
    copy = json.loads((tmp_path / PARSED_NAME).read_text())
    copy["files"]["a.yaml"]["data"] = {"x": 2}
    (tmp_path / PARSED_NAME).write_text(json.dumps(copy))
    assert read_yaml(tmp_path / "a.yaml", "t") == {"x": 2}     # the copy was read
    (tmp_path / "a.yaml").write_text("x: 1  \n")              # one byte more: parsed
    assert read_yaml(tmp_path / "a.yaml", "t") == {"x": 1}
    (tmp_path / PARSED_NAME).write_text("{not json")          # damaged copy: parsed
    assert read_yaml(tmp_path / "a.yaml", "t") == {"x": 1}


def test_values_json_cannot_keep_are_left_to_pyyaml(tmp_path):
    (tmp_path / "int_keys.yaml").write_text("a: {1: x}\n")
    (tmp_path / "date.yaml").write_text("d: 2024-01-01\n")
    (tmp_path / "bad.yaml").write_text("a: [\n")
    (tmp_path / "ok.yaml").write_text("a: 1.0\nb: 1\nc: true\nd: null\n")
    assert sorted(parsed_entries(tmp_path)) == ["ok.yaml"]
    assert read_yaml(tmp_path / "int_keys.yaml", "t") == {"a": {1: "x"}}


def test_presets_load_without_pyyaml():
    """Loading a preset cluster and runtime imports no PyYAML (start-up time)."""
    code = ("import sys; from parosim.io import load_cluster; from parosim.io.runtime import "
            "load_runtime; load_cluster('dgx-h100-ib', nodes=4); load_runtime('deepspeed'); "
            "print('yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
