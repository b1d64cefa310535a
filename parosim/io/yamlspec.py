"""Shared helpers for reading YAML specs strictly: unknown keys and wrong types are errors."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (PyYAML keeps the last)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
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


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)

MAX_YAML_BYTES = 16 * 2**20  # a spec file larger than this is not a spec


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping; every failure is an :class:`InputError`.

    The file must be UTF-8, hold a mapping and give each key once.
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
    hit = _PARSED.get(text)
    if hit is not None:   # the same text parsed before (a sweep reads one preset per point)
        return copy.deepcopy(hit)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
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
