"""parosim: a discrete-event simulator of LLM training on GPU clusters with PaRO strategies.

See README.md. The package has floors, each importing only those below it::

    errors, units < spec < io, fabric < collectives < cost < plan < evaluate < simulate
      < studies, calibrate, sweep < plots, cli        (validate: the torch.distributed harness)

The core (spec ... simulate) imports no pandas, matplotlib or torch; those live at the edges
(io, plots, sweep, validate, cli).

Modules that moved into the floors keep their old import paths for one release
(``parosim.specs`` is ``parosim.spec.system``, and so on: :data:`MOVED`); importing an old
path gives the same module object and a :class:`DeprecationWarning`. A module whose names
went to several homes (``a|b``) is a view that looks each name up in them in turn.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

__version__ = "0.1.0"

#: old module path -> its home in the floors (aliases kept for one release)
MOVED = {
    "parosim.specs": "parosim.spec.system", "parosim.gpus": "parosim.spec.gpus",
    "parosim.models": "parosim.spec.model", "parosim.training": "parosim.spec.training",
    "parosim.strategies": "parosim.spec.strategy",
    "parosim.runtime": "parosim.spec.runtime|parosim.io.runtime",
    "parosim.graphlite": "parosim.fabric.graphlite", "parosim.topology": "parosim.fabric.topology",
    "parosim.symmetry": "parosim.fabric.symmetry", "parosim.network": "parosim.fabric.network",
    "parosim.engine": "parosim.fabric.engine", "parosim.ncclbench": "parosim.collectives.bench",
    "parosim.compute": "parosim.cost.compute", "parosim.kernels": "parosim.cost.kernels",
    "parosim.memory": "parosim.cost.memory", "parosim.fp8mem": "parosim.cost.fp8mem",
    "parosim.runtime_plan": "parosim.plan.runtime",
    "parosim.plan3d": ("parosim.plan.threed|parosim.plan.threed_parts|parosim.plan.memory3d|"
                       "parosim.evaluate.threed"),
    "parosim.parallel": "parosim.plan.layout", "parosim.analytic": "parosim.evaluate.analytic",
    "parosim.replay": "parosim.evaluate.replay", "parosim.ranks": "parosim.evaluate.ranks",
    "parosim.advise": "parosim.studies.advise", "parosim.jobs": "parosim.studies.jobs",
    "parosim.run": "parosim.studies.run", "parosim.calibrate_steps": "parosim.calibrate.steps",
    "parosim.plots_hetero": "parosim.plots.hetero", "parosim.advise_plot": "parosim.plots.advise",
    "parosim.cli_calibrate": "parosim.cli.calibrate", "parosim.cli_nccl": "parosim.cli.nccl",
}


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.targets = target.split("|")

    def create_module(self, spec):
        if len(self.targets) == 1:
            return importlib.import_module(self.targets[0])
        homes = [importlib.import_module(t) for t in self.targets]
        view = types.ModuleType(spec.name, f"{spec.name}: its names now live in "
                                + ", ".join(self.targets))

        def lookup(name):
            for m in homes:
                if hasattr(m, name):
                    return getattr(m, name)
            raise AttributeError(f"module {spec.name!r} has no attribute {name!r}")

        view.__getattr__ = lookup
        return view

    def exec_module(self, module):   # the target modules are already executed
        pass


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Resolves an old module path to the module object at its new home."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _MovedLoader(new))


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())


def forward_names(package: str, submodule: str, *more: str):
    """A module ``__getattr__`` for ``package`` that finds its names in ``package.submodule``
    (then in each of ``more``, in turn) on first use (a package that was one module keeps its
    names; importing one of its submodules stays cheap)."""

    homes = (submodule, *more)

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for sub in homes[:-1]:
            mod = importlib.import_module(f"{package}.{sub}")
            if hasattr(mod, name):
                return getattr(mod, name)
        return getattr(importlib.import_module(f"{package}.{homes[-1]}"), name)

    return __getattr__
