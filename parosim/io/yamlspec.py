"""Shared helpers for reading YAML specs strictly: unknown keys and wrong types are errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping; every failure is an :class:`InputError`."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise InputError(f"{what} file {str(p)!r} does not exist") from None
    except OSError as e:
        raise InputError(f"{what} file {str(p)!r} cannot be read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise InputError(f"{what} file {str(p)!r} is malformed YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise InputError(f"{what} file {str(p)!r} must hold a mapping of keys, got "
                         f"{type(data).__name__}")
    return data


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
