"""Every command in README.md's shell code blocks runs as written.

The extractor is generic: it reads every fenced ``bash``/``sh``/``shell``/``console`` block of
README.md, joins ``\\`` continuations, drops comments, splits ``&&`` chains, and runs each
``parosim ...`` / ``python -m parosim...`` command in-process (``parosim.cli.main``) from a
scratch directory (arguments naming files of the repository are made absolute; an ``--out``
directory that exists in the repository is copied first, so a resumable sweep resumes there
instead of writing into the repository), and each ``python SCRIPT.py ...`` in a subprocess
from the repository root (the documented scripts read the repository and print). Each command
must exit 0.

Commands not run are listed in ``NOT_RUN`` with the reason (a prefix match); a command that is
neither run nor listed fails the test, so a new README command cannot be skipped silently.
Cluster YAML blocks must load.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
from pathlib import Path

import pytest
import yaml

from parosim.cli.commands import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TIMEOUT_S = 240

# prefix -> why it is not run here (the explicit marker list)
NOT_RUN = {
    "pip install": "installation: CI's first step (.ci/run) does it",
    "python -m pytest": "the test suite itself",
    "parosim validate --emulate": "needs root and network namespaces and takes minutes; "
                                  "tests/test_validate_emulation.py runs it",
    "experiments/run_all.sh": "runs all ten experiment sweeps into a new "
                              "directory; each uses the 'parosim sweep' form run here, and "
                              "tests/test_sweep.py checks where it writes",
    "parosim sweep SPEC.yaml": "a template with placeholders (SPEC, DIR, HOST); "
                               "tests/test_sweep_dask.py runs sweeps on a Dask scheduler",
}


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    blocks, lang, body, inside = [], "", [], False
    for line in text.splitlines():
        m = re.match(r"^\s*```\s*([\w-]*)", line)
        if m:
            if inside:
                blocks.append((lang, "\n".join(body)))
                inside, body = False, []
            else:
                inside, lang = True, m.group(1).lower()
            continue
        if inside:
            body.append(line)
    return blocks


def readme_commands(text: str) -> list[str]:
    cmds = []
    for lang, body in readme_blocks(text):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        body = re.sub(r"\\\n\s*", " ", body)
        for line in body.splitlines():
            line = line.strip()
            if lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line, comments=True)
            cmd: list[str] = []
            for w in [*words, "&&"]:
                if w == "&&":
                    if cmd:
                        cmds.append(shlex.join(cmd))
                    cmd = []
                else:
                    cmd.append(w)
    return cmds


COMMANDS = list(dict.fromkeys(readme_commands(README.read_text())))  # each once


def test_extractor_finds_the_commands():
    assert "parosim compare" in COMMANDS
    assert any(c.startswith("parosim collective") for c in COMMANDS)
    assert readme_commands("```bash\nparosim a \\\n  --b 1 # c\nx && parosim d\n```\n") == [
        "parosim a --b 1", "x", "parosim d"]


def _args(cmd: str, tmp: Path) -> list[str]:
    words = shlex.split(cmd)
    if words[:2] == ["python", "-m"]:
        words = words[2:]
    args = words[1:]
    out = []
    for i, a in enumerate(args):
        if i > 0 and args[i - 1] == "--out" and (ROOT / a).is_dir():
            dest = tmp / a
            shutil.copytree(ROOT / a, dest)
            out.append(str(dest))
        elif not a.startswith("-") and (ROOT / a).exists():
            out.append(str(ROOT / a))
        else:
            out.append(a)
    return out


def _alarm(signum, frame):
    raise TimeoutError


@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command_runs(cmd, tmp_path, monkeypatch, capsys):
    skip = next((why for prefix, why in NOT_RUN.items() if cmd.startswith(prefix)), None)
    if skip:
        pytest.skip(f"not run: {skip}")
    script = re.match(r"^python3? (\S+\.py)\b(.*)$", cmd)
    if script:
        import os
        import subprocess
        import sys

        p = subprocess.run([sys.executable, str(ROOT / script.group(1)),
                            *shlex.split(script.group(2))], cwd=ROOT, capture_output=True,
                           text=True, timeout=TIMEOUT_S,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert p.returncode == 0, f"{cmd!r} exited {p.returncode}: {p.stderr[-2000:]}"
        return
    assert re.match(r"^(parosim|python -m parosim)\b", cmd), (
        f"README command {cmd!r} is neither run by this test nor listed in NOT_RUN")
    monkeypatch.chdir(tmp_path)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT_S)
    try:
        rc = main(_args(cmd, tmp_path))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    err = capsys.readouterr().err
    assert rc == 0, f"{cmd!r} exited {rc}: {err[-2000:]}"


def test_readme_cluster_yaml_loads():
    from parosim.io.cluster import cluster_from_dict

    found = 0
    for lang, body in readme_blocks(README.read_text()):
        if lang in ("yaml", "yml") and "gpus_per_node" in body:
            spec = cluster_from_dict(yaml.safe_load(body))
            assert spec.gpus >= 1
            found += 1
    assert found >= 1
