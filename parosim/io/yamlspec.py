"""Shared helpers for reading YAML specs strictly: unknown keys and wrong types are errors.

A directory of presets may hold a *parsed copy* (:data:`PARSED_NAME`, written by
:func:`write_parsed`): each preset's mapping as JSON, with the YAML text it was parsed from.
:func:`read_yaml` uses an entry only when the file's text is exactly that text (an edited
preset is parsed again), and so reads the presets without importing PyYAML (start-up time);
every other file, and every failure, goes through PyYAML as before.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import InputError

#: the parsed copy of a directory's YAML files (see the module docstring)
PARSED_NAME = "parsed-yaml.json"


@lru_cache(maxsize=1)
def _strict_loader():
    """A safe loader that refuses a key given twice in one mapping (PyYAML keeps the last)."""
    import yaml  # deferred: PyYAML is imported only when a file is parsed (start-up)

    class StrictLoader(yaml.SafeLoader):
        pass

    def no_duplicates(loader, node, deep: bool = False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue  # the base constructor reports unhashable keys
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return loader.construct_mapping(node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, no_duplicates)
    return StrictLoader


MAX_YAML_BYTES = 16 * 2**20  # a spec file larger than this is not a spec


def read_yaml(path: str | Path, what: str, parsed_copy: bool = True) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping; every failure is an :class:`InputError`.

    The file must be UTF-8, hold a mapping and give each key once. A file with an entry in
    its directory's parsed copy (:data:`PARSED_NAME`) for exactly this text is not parsed
    again.
    """
    p = Path(path)
    try:
        if p.is_dir():
            raise InputError(f"{what} file {str(p)!r} is a directory; expected a YAML file")
        if p.stat().st_size > MAX_YAML_BYTES:
            raise InputError(f"{what} file {str(p)!r} is larger than 16 MiB; expected a "
                             "YAML spec")
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} file {str(p)!r} does not exist") from None
    except OSError as e:
        raise InputError(f"{what} file {str(p)!r} cannot be read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise InputError(f"{what} file {str(p)!r} is not UTF-8 text (byte {raw[e.start]:#04x} "
                         f"at line {line}); expected a UTF-8 YAML file") from None
    data = _parsed_copy(p, text) if parsed_copy else None
    if data is not None:
        return data
    hit = _PARSED.get(text)
    if hit is not None:   # the same text parsed before (a sweep reads one preset per point)
        return copy.deepcopy(hit)
    import yaml  # deferred: PyYAML is imported only when a file is parsed (start-up)

    try:
        data = yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise InputError(f"{what} file {str(p)!r} is malformed YAML{where}: {problem}") from None
    except (ValueError, OverflowError, RecursionError) as e:  # e.g. a bad timestamp value
        raise InputError(f"{what} file {str(p)!r} holds a value YAML cannot read: "
                         f"{e}") from None
    if not isinstance(data, dict):
        raise InputError(f"{what} file {str(p)!r} must hold a mapping of keys, got "
                         f"{type(data).__name__}")
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[text] = copy.deepcopy(data)   # callers may change what they get
    return data


# Parsed mappings by file text (the text, not the path: an edited file is parsed again);
# read_yaml hands out copies.
_PARSED: dict[str, dict[str, Any]] = {}
_PARSED_MAX = 64


def section(data: dict[str, Any], key: str, allowed: set[str], where: str,
            required: bool = False) -> dict[str, Any]:
    """The sub-mapping ``data[key]``, checked against the allowed keys."""
    if key not in data:
        if required:
            raise InputError(f"{where}: missing required section {key!r}")
        return {}
    sub = data[key]
    if not isinstance(sub, dict):
        raise InputError(f"{where}: {key!r} must be a mapping, got {sub!r}")
    check_keys(sub, allowed, f"{where}: {key}")
    return sub


def check_keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(map(str, data)) - allowed)
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}; expected one of "
                         f"{', '.join(sorted(allowed))}")


def positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} = {value!r} must be a positive integer")
    return value


def number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name} = {value!r} must be a number")
    return float(value)


def name_value(value: Any, where: str) -> str:
    """A ``name:`` field: a non-empty string (a YAML number is read as its text); a list, a
    mapping, a boolean or an empty string is refused."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError(f"{where}: name = {value!r} must be a string, e.g. name: my-cluster")
    text = str(value)
    if not text.strip():
        raise InputError(f"{where}: name is empty; expected a non-empty string")
    return text


def _same(a: Any, b: Any) -> bool:
    """``a == b`` with the same types all the way down (1 is not 1.0, nor True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return (list(a) == list(b) and all(_same(k, j) for k, j in zip(a, b, strict=True))
                and all(_same(a[k], b[k]) for k in a))
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)  # NaN equals NaN here


def _parsed_copy(path: Path, text: str) -> dict[str, Any] | None:
    """The mapping of ``path`` from its directory's parsed copy, if that holds an entry for
    exactly this text (else None: the caller parses the file)."""
    stored_at = path.parent / PARSED_NAME
    try:
        stored = stored_at.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        entry = json.loads(stored).get("files", {}).get(path.name)
    except (ValueError, AttributeError):  # not ours, or damaged: parse the YAML instead
        return None
    if not isinstance(entry, dict) or entry.get("yaml") != text:
        return None
    data = entry.get("data")
    return data if isinstance(data, dict) else None


def parsed_entries(directory: str | Path) -> dict[str, dict[str, Any]]:
    """The parsed copy of ``directory``'s ``*.yaml`` files: file name -> its text and
    mapping, for every file that parses and whose mapping JSON keeps exactly (types
    included; a file with, e.g., a date or a number as a key is left to PyYAML)."""
    out = {}
    for f in sorted(Path(directory).glob("*.yaml")):
        try:
            data = read_yaml(f, "preset", parsed_copy=False)
        except InputError:
            continue
        try:
            kept = json.loads(json.dumps(data))
        except (TypeError, ValueError):   # e.g. a date: not JSON
            continue
        if _same(kept, data):
            out[f.name] = {"yaml": f.read_bytes().decode("utf-8"), "data": data}
    return out


def parsed_text(directory: str | Path) -> str:
    """The text of ``directory``'s parsed copy (:func:`write_parsed` writes it)."""
    return json.dumps({"about": "this directory's YAML files parsed, each entry used only "
                       "while the file's text is its 'yaml'; written by python -m "
                       "parosim.io.yamlspec DIR", "files": parsed_entries(directory)},
                      indent=1) + "\n"


def write_parsed(directory: str | Path) -> Path:
    """Write ``directory``'s parsed copy (:data:`PARSED_NAME`); returns its path."""
    out = Path(directory) / PARSED_NAME
    out.write_text(parsed_text(directory), encoding="utf-8")
    return out


if __name__ == "__main__":  # python -m parosim.io.yamlspec [DIR...]: write the parsed copies
    # (default: the repository's topologies/ and runtimes/)
    import sys  # deferred: only this script needs it

    root = Path(__file__).resolve().parents[2]
    for d in sys.argv[1:] or [root / "topologies", root / "runtimes"]:
        print(write_parsed(d))
