"""The notebooks run top to bottom on their small settings (nbclient, python3 kernel)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.fixture(scope="module")
def kernel() -> str:
    """The ``python3`` kernel of this interpreter, installed for the user if missing."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user"], check=True,
                       capture_output=True)
    return "python3"


@pytest.mark.notebooks
@pytest.mark.parametrize("name", ["quickstart", "paper_reproduction", "what_if"])
def test_notebook_runs(name, kernel, tmp_path):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    # run from a directory outside the repository: the notebooks find experiments/ themselves
    client = nbclient.NotebookClient(nb, kernel_name=kernel, timeout=120,
                                     resources={"metadata": {"path": str(tmp_path)}})
    committed = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    # the figures were drawn (a Figure returned or displayed renders as a PNG)
    assert any("image/png" in o.get("data", {}) for o in outputs)
    # the outputs stored in the notebook (what a reader sees without running it) are today's:
    # same text, cell by cell (figures are compared by their size only)
    assert _texts(nb) == _texts(committed), (
        f"notebooks/{name}.ipynb shows stale outputs: re-execute it and save (nbclient, "
        "record_timing=False)")


def _texts(nb) -> list[list[str]]:
    """Each code cell's text outputs (stream text, text/plain, text/html)."""
    out = []
    for c in nb.cells:
        if c.cell_type == "code":
            out.append([str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                        + str(o.get("data", {}).get("text/html", ""))
                        for o in c.get("outputs", [])])
    return out
