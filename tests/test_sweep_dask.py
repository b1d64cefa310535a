"""A real dask.distributed cluster runs the same sweep to the same rows (``--scheduler``)."""

from __future__ import annotations

import pytest

from parosim.errors import InputError
from parosim.io.sweep import sweep_from_dict
from parosim.sweep.runner import run_sweep

distributed = pytest.importorskip("distributed")

SPEC = {
    "name": "dask", "kind": "collective", "mode": "engine",
    "grid": {"nodes": [2, 4], "algo": ["ring", "hierarchical", "ho-ring"],
             "group_nodes": [1, 2, 3]},  # group_nodes 3 does not divide: error rows
    "fixed": {"cluster": "paper-a100-roce", "op": "reduce-scatter", "size": "32MB"},
}


def test_dask_cluster_gives_the_same_rows_as_local(tmp_path):
    spec = sweep_from_dict(SPEC)
    local = run_sweep(spec, tmp_path / "local", workers=1, progress=False)
    assert local["errors"] == 6 and local["ok"] == 12
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, silence_logs=50) as cluster:
        remote = run_sweep(spec, tmp_path / "dask", scheduler=cluster.scheduler_address,
                           progress=False)
    assert (remote["done"], remote["failed"]) == (18, 6)
    assert (tmp_path / "dask" / "results.csv").read_text() == \
        (tmp_path / "local" / "results.csv").read_text()


def test_unreachable_scheduler_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot reach the dask scheduler"):
        run_sweep(sweep_from_dict(SPEC), tmp_path, scheduler="tcp://127.0.0.1:9",
                  progress=False, scheduler_timeout_s=0.5)
    assert not (tmp_path / "results.csv").exists()  # nothing started
