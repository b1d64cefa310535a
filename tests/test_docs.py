"""The documentation: no tracker references, links that resolve, every cluster-YAML and
model key documented, and docs/api.md's Python examples run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# "issue 9", "issues 12", "Issue #3", "(#12)", "see #4": references to a tracker. Citations of
# other projects' trackers are written as addresses (github.com/NVIDIA/nccl/issues/1264), which
# neither pattern matches; an anchor such as README.md#10-a-run follows a word character.
ISSUE_RE = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w/&#])#\d+\b", re.IGNORECASE)


def user_facing_texts() -> list[tuple[str, str]]:
    files = [ROOT / "README.md", *sorted(DOCS.rglob("*.md")),
             *sorted((ROOT / "experiments").rglob("*.md"))]
    out = [(str(f.relative_to(ROOT)), f.read_text(encoding="utf-8")) for f in files]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        for k, c in enumerate(cells):
            src = "".join(c["source"])
            if c["cell_type"] == "code":   # comments and strings a reader sees; outputs too
                src += "".join("".join(o.get("text", "")) for o in c.get("outputs", []))
            out.append((f"{nb.relative_to(ROOT)} cell {k}", src))
    return out


def test_the_issue_pattern_can_fail():
    for bad in ("(issue 8)", "Issue #12", "issues 152/175", "see #4", "from issue 2:"):
        assert ISSUE_RE.search(bad), bad
    for ok in ("github.com/NVIDIA/nccl/issues/1264", "README.md#10-a-whole-run",
               "the host issues PyTorch eager kernels", "color #fff", "`#` comments"):
        assert not ISSUE_RE.search(ok), ok


def test_no_tracker_references_in_user_facing_text():
    hits = []
    for name, text in user_facing_texts():
        for m in ISSUE_RE.finditer(text):
            line = text[:m.start()].count("\n") + 1
            hits.append(f"{name}:{line}: {text[max(0, m.start() - 30):m.end() + 10]!r}")
    assert not hits, "tracker references in user-facing text:\n" + "\n".join(hits)


def test_cli_help_names_no_tracker_reference():
    from parosim.cli.commands import build_parser

    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._actions:
        for sub in getattr(action, "choices", None) or {}:
            if hasattr(action.choices[sub], "format_help"):
                texts.append(action.choices[sub].format_help())
    assert len(texts) > 5
    for t in texts:
        assert not ISSUE_RE.search(t), ISSUE_RE.search(t)


LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK_RE.findall(text)
            if not re.match(r"^[a-z][a-z+.-]*:", t) and not t.startswith("#")]


def test_link_extractor_can_fail(tmp_path):
    p = tmp_path / "x.md"
    p.write_text("[a](missing.md) [b](https://x.org) [c](#anchor) ![d](img.png)\n"
                 "```\n[e](in-code.md)\n```\n")
    assert relative_links(p) == ["missing.md", "img.png"]


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))],
                         ids=lambda p: p.name)
def test_relative_links_resolve(page):
    missing = [t for t in relative_links(page)
               if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.name}: links to missing files: {missing}"


def test_docs_index_lists_every_page():
    index = (DOCS / "README.md").read_text()
    for page in DOCS.glob("*.md"):
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/README.md does not list {page.name}"


def test_no_reference_outside_the_repository():
    """User-facing text names no folder beside the checkout (relative, ``../NAME/``, or by
    its absolute path): users have the repository only."""
    siblings = sorted(p.name for p in ROOT.parent.iterdir() if p.is_dir() and p != ROOT)
    outside = [f"../{n}/" for n in siblings] + [f"{ROOT.parent / n}/" for n in siblings]
    for name, text in user_facing_texts():
        assert not [o for o in outside if o in text], name


# --- cluster YAML: every key the strict reader accepts is documented -------------------------

def cluster_keys() -> set[str]:
    """Every key the cluster reader accepts, as ``section.key`` (``key`` at the top level):
    recorded from the allowed-key sets the reader hands to its strict checks while it reads a
    file that opens every section (the sets are the reader's own, literal or named)."""
    import parosim.io.cluster as c

    seen: set[str] = set()
    real_check, real_section = c.check_keys, c.section

    def prefix(where: str) -> str:
        p = where.split(": ", 1)[1] if ": " in where else ""
        p = re.sub(r"overrides\[\d+\]", "overrides", p)
        return p.replace(": ", ".")

    def check_keys(data, allowed, where):
        p = prefix(where)
        seen.update(f"{p}.{k}" if p else k for k in allowed)
        return real_check(data, allowed, where)

    def section(data, key, allowed, where, required=False):
        p = prefix(where)
        p = f"{p}.{key}" if p else key
        seen.update(f"{p}.{k}" for k in allowed)
        return real_section(data, key, allowed, where, required)

    spec = {"name": "x", "gpus_per_node": 8, "gpu": {"model": "A100-SXM4-80GB"},
            "intra_node": {"bandwidth": "2000Gbps"}, "nic": {"bandwidth": "100Gbps"},
            "collective": {"ring_ll": {"bw_efficiency": 0.5}},
            "overrides": [{"nodes": [0], "nic": {"bandwidth": "25Gbps"},
                           "intra_node": {"bandwidth": "100GB/s"},
                           "gpu": {"model": "H100-SXM5-80GB"}},
                          {"gpus": ["n0/gpu1"], "speed": 0.8},
                          {"links": [["n0/nic0", "switch"]], "failed": True}]}
    c.check_keys, c.section = check_keys, section
    try:
        c.cluster_from_dict(spec, where="cluster")
    finally:
        c.check_keys, c.section = real_check, real_section
    return seen


def documented_keys(text: str) -> set[str]:
    """Keys named in the first column of docs/cluster-yaml.md's tables: `` `gpu.memory` ``;
    ``<proto>`` stands for each NCCL algorithm-protocol section, listed on the page."""
    keys = set(re.findall(r"(?m)^\|\s*`([\w.<>]+)`", text))
    protos = re.findall(r"`collective\.((?:ring|tree)_\w+)`", text)
    return keys | {k.replace("<proto>", p) for k in keys if "<proto>" in k for p in protos}


def test_cluster_key_extraction_finds_the_sections():
    keys = cluster_keys()
    for k in ("name", "gpu.memory", "nic.per_node", "network.ecmp", "collective.step_latency",
              "collective.ring_simple.base_latency", "compute.gemm_k_half",
              "overrides.links", "overrides.nic.bandwidth", "overrides.gpu.peak_tflops",
              "jitter.cv"):
        assert k in keys, k
    assert len(keys) > 100


def test_every_cluster_key_is_documented():
    doc = documented_keys((DOCS / "cluster-yaml.md").read_text())
    missing = sorted(cluster_keys() - doc)
    assert not missing, f"docs/cluster-yaml.md does not document: {missing}"
    assert documented_keys("| `gpu.memory` | x |\n") == {"gpu.memory"}


def test_every_model_key_is_documented():
    from parosim.io import model as m

    doc = set(re.findall(r"(?m)^\|\s*`([\w.]+)`", (DOCS / "model-yaml.md").read_text()))
    keys = set(m._KEYS) | set(m.HF_REQUIRED) | set(m.HF_CHECKED) | set(m.HF_IGNORED) | set(
        m.HF_MOE) | set(m._ATTENTION_KEYS) | set(m._MOE_KEYS) | {
        k for keys_, ignored in m.HF_MOE_TYPES.values() for k in (*keys_, *ignored)}
    missing = sorted(keys - doc)
    assert not missing, f"docs/model-yaml.md does not document: {missing}"


# --- docs/api.md: every python block runs --------------------------------------------------

def python_blocks(text: str) -> list[str]:
    return re.findall(r"(?ms)^```python\n(.*?)^```", text)


def test_api_page_has_examples():
    blocks = python_blocks((DOCS / "api.md").read_text())
    assert len(blocks) >= 4
    assert python_blocks("```python\nx = 1\n```\n") == ["x = 1\n"]


def test_api_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    for k, block in enumerate(python_blocks((DOCS / "api.md").read_text())):
        try:
            exec(compile(block, f"docs/api.md block {k}", "exec"), ns)  # noqa: S102
        except Exception as e:   # name the block that failed
            raise AssertionError(f"docs/api.md python block {k} failed: {e!r}") from e
