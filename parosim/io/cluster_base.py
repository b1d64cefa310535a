"""What-ifs as a few keys over a cluster: ``base: PRESET`` in a cluster YAML and the
``--set KEY=VALUE`` flag (docs/cluster-yaml.md, "Extending a preset").

The merge rule, in one place: a mapping merges key by key, recursively (``nic: {bandwidth:
100Gbps}`` over a base keeps the base's ``nic.per_node`` and ``nic.latency``); any other value
(a number, a string, a list such as ``overrides`` or ``collective.protocols``, ``null``)
replaces the base's. ``base`` itself may name a preset or a YAML path (relative to the file
that names it) and may extend another base, up to :data:`MAX_BASE_DEPTH` files.

``--set`` applies after the files, in the order given, with the same rule: ``--set
nic.bandwidth=100Gbps`` is the mapping ``{nic: {bandwidth: 100Gbps}}`` merged over the
cluster. The value is read as a YAML value, so units are written as in the file (``100Gbps``,
``5us``, ``80GB``) and ``true``, ``8``, ``[ll, simple]`` or ``[{nodes: [5], speed: 0.8}]``
are a flag, a count and lists. A key the cluster YAML does not know is refused with one line.

>>> merge({"nic": {"per_node": 8, "bandwidth": "200Gbps"}}, {"nic": {"bandwidth": "100Gbps"}})
{'nic': {'per_node': 8, 'bandwidth': '100Gbps'}}
>>> set_item("nic.bandwidth=100Gbps", {"nic": {"bandwidth": None}})
(('nic', 'bandwidth'), '100Gbps')
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError

MAX_BASE_DEPTH = 8   # files in one chain of bases (a longer chain is a cycle or a mistake)

# The cluster YAML's keys, for --set: a section maps to its keys, a leaf to None.
Schema = dict[str, Any]


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merge key by key (recursively); any other value
    replaces the base's. Neither argument is changed."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def _known(schema: Schema, prefix: str = "") -> list[str]:
    out = []
    for k, sub in schema.items():
        out.append(prefix + k)
        if isinstance(sub, dict):
            out.extend(_known(sub, prefix + k + "."))
    return out


def set_item(item: str, schema: Schema, name: str = "--set"
             ) -> tuple[tuple[str, ...], Any]:
    """One ``KEY=VALUE`` of ``--set``: (the key's path, the value read as YAML). Refuses,
    with one line naming the item, a missing ``=``, an empty key or value, a key the cluster
    YAML does not have and a value YAML cannot read."""
    text = str(item)
    if "=" not in text:
        raise InputError(f"{name} {text!r} has no '='; expected KEY=VALUE, e.g. --set "
                         "nic.bandwidth=100Gbps")
    key, raw = (s.strip() for s in text.split("=", 1))
    path = tuple(key.split("."))
    node: Any = schema
    for depth, part in enumerate(path):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(path[:depth])
            choices = sorted(node) if isinstance(node, dict) else []
            hint = (f"expected one of {', '.join(choices)}" + (f" under {where!r}" if where
                                                                else "")
                    if choices else f"{where!r} is a value, not a section")
            raise InputError(f"{name} {text!r}: unknown cluster key {key!r}; {hint}")
        node = node[part]
    if not raw:
        raise InputError(f"{name} {text!r} has no value; expected KEY=VALUE, e.g. --set "
                         f"{key}=...")
    import yaml  # deferred: PyYAML is imported only when a --set value is read (start-up)

    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise InputError(f"{name} {text!r}: the value {raw!r} cannot be read ({problem}); "
                         "expected a YAML value such as 100Gbps, 8, true or [ll, simple]"
                         ) from None
    if value is None:
        raise InputError(f"{name} {text!r} has no value; expected KEY=VALUE with a value")
    return path, value


def apply_sets(data: dict[str, Any], sets: tuple[str, ...] | list[str],
               schema: Schema) -> dict[str, Any]:
    """``data`` with every ``--set`` item merged on top, in order."""
    for item in sets:
        path, value = set_item(item, schema)
        over: dict[str, Any] = {path[-1]: value}
        for part in reversed(path[:-1]):
            over = {part: over}
        data = merge(data, over)
    return data


def split_sets(value: Any, name: str = "cluster_set") -> tuple[str, ...]:
    """The ``KEY=VALUE`` items of a sweep point's ``cluster_set`` (one string, items separated
    by ``;``; empty or None: none).

    >>> split_sets("nic.bandwidth=100Gbps; collective.model=ideal")
    ('nic.bandwidth=100Gbps', 'collective.model=ideal')
    """
    if value is None or value == "":
        return ()
    if not isinstance(value, str):
        raise InputError(f"{name} = {value!r} must be a string of KEY=VALUE items separated "
                         "by ';', e.g. 'nic.bandwidth=100Gbps; collective.model=ideal'")
    return tuple(s.strip() for s in value.split(";") if s.strip())


def known_keys(schema: Schema) -> list[str]:
    """Every dotted key ``--set`` accepts (for documentation and tests)."""
    return _known(schema)
