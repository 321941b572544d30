"""Typed dataclass configs read from and written to JSON, strictly.

Every config in eaglewire is a dataclass whose fields carry `metadata={"help": ...}`. Reading
rejects unknown keys and missing required keys and checks basic types, naming the file and
the dotted field path, so a typo in a config is an error and not a silently ignored default.
Writing is atomic (see `eaglewire.io_utils.atomic_write_text`).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from eaglewire.errors import ConfigError

T = TypeVar("T")


def help_field(help: str, **kwargs: Any) -> Any:
    """`dataclasses.field` with a description, so every field documents itself."""
    return dataclasses.field(metadata={"help": help}, **kwargs)


def field_help(cls: type, name: str) -> str:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return str(f.metadata.get("help", ""))
    raise KeyError(name)


def to_dict(obj: Any) -> Any:
    """Dataclass (nested, tuples, enums) -> plain JSON-able structure."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: value {value!r} matches none of {[_type_name(a) for a in args]}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected an object, got {type(value).__name__}")
        return from_dict(tp, value, where=where)
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        elem = args[0] if args else Any
        items = [_convert(v, elem, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected an object, got {type(value).__name__}")
        vt = args[1] if len(args) == 2 else Any
        return {k: _convert(v, vt, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(f"{where}: expected one of {[m.value for m in tp]}, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
        return value
    return value


def from_dict(cls: type[T], data: dict[str, Any], *, where: str = "") -> T:
    """Build dataclass `cls` from `data`; unknown or missing keys are errors naming the path."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{where}." if where else ""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key in {cls.__name__} (known: {sorted(fields)})")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(
                    f"{prefix}{name}: required key missing from {cls.__name__} ({f.metadata.get('help', '')})"
                )
            continue
        kwargs[name] = _convert(data[name], hints[name], f"{prefix}{name}")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


def read_json_file(path: Path) -> Any:
    """Parse a JSON file; a syntax error names the file, line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None


def load_config(cls: type[T], path: Path) -> T:
    return from_dict(cls, read_json_file(path), where=str(path))
