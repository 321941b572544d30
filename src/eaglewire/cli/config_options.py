"""Command-line options derived from typed config fields, so that a knob is declared once: the
field gives the option its type, its help and (where the command has one) its default.

A command lists the fields it exposes (`FieldOption`: the field's dotted path, and its flag where
that differs from `--field-name`); `ConfigOptions.add_to` appends them to the command's signature,
and the command receives them in `**options`, which `given` turns into {path: value}. Like the rest
of the CLI, no torch here.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class FieldOption:
    """One option for the config field at `path` (`train.max_seconds`, `num_steps`)."""

    path: str
    flag: str | None = None  # default: --<field-name>; a bool field's is '--on/--off' (default --x/--no-x)
    parse: Callable[[str], Any] | None = None  # the typed text -> the field's value (tuples, say)


@dataclass(frozen=True)
class ResolvedOption:
    option: FieldOption
    field: dataclasses.Field[Any]
    field_type: Any  # the field's resolved type hint
    param: str  # the Python parameter name the command receives it under

    @property
    def flag(self) -> str:
        """The option's flag as given in `--help` (`--pack/--no-pack`)."""
        if self.option.flag is not None:
            return self.option.flag
        flag = "--" + self.field.name.replace("_", "-")
        return f"{flag}/--no-{flag[2:]}" if self.field_type is bool else flag

    @property
    def names(self) -> tuple[str, ...]:
        """Every spelling of the flag (`--pack`, `--no-pack`)."""
        return tuple(self.flag.split("/"))

    def cli_type(self) -> type:
        """What the command line parses: the field's own scalar type, text for choices and tuples."""
        tp = self.field_type
        if tp in (int, float, bool, str):
            return typing.cast(type, tp)
        if self.option.parse is None and not self.choices():
            raise TypeError(f"{self.option.path}: a {tp} field needs FieldOption.parse")
        return str

    def choices(self) -> tuple[str, ...]:
        tp = self.field_type
        if typing.get_origin(tp) is typing.Literal:
            return tuple(map(str, typing.get_args(tp)))
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return tuple(str(m.value) for m in tp)
        return ()


def resolve(config: type, path: str) -> tuple[dataclasses.Field[Any], Any]:
    """The dataclass field at dotted `path` under `config`, and its resolved type."""
    owner: Any = config
    *parts, name = path.split(".")
    for part in parts:
        owner = typing.get_type_hints(owner)[part]
    fields = {f.name: f for f in dataclasses.fields(owner)}
    if name not in fields:
        raise KeyError(f"{config.__name__} has no field {path!r}")
    return fields[name], typing.get_type_hints(owner)[name]


def field_value(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


class ConfigOptions:
    """The options of `config`'s fields listed in `options`. With `defaults` (a `config` instance)
    each option defaults to its value; without, to None (given flags override a config that comes
    from elsewhere). `help_prefix` opens every option's help; `help_suffix(path)` ends it."""

    def __init__(
        self,
        config: type,
        options: Sequence[FieldOption],
        *,
        defaults: Any = None,
        help_prefix: str = "",
        help_suffix: Callable[[str], str] | None = None,
    ) -> None:
        self.config = config
        self.defaults = defaults
        self.help_prefix = help_prefix
        self.help_suffix = help_suffix
        self.resolved: list[ResolvedOption] = []
        for option in options:
            field, field_type = resolve(config, option.path)
            param = option.flag.split("/")[0][2:] if option.flag else field.name
            self.resolved.append(ResolvedOption(option, field, field_type, param.replace("-", "_")))
        params = [r.param for r in self.resolved]
        if len(set(params)) != len(params):
            raise ValueError(f"two options share a parameter name: {params}")

    def help(self, r: ResolvedOption) -> str:
        text = self.help_prefix + str(r.field.metadata.get("help", ""))
        if r.choices():
            text += f" ({' | '.join(r.choices())})"
        if self.help_suffix is not None:
            text += self.help_suffix(r.option.path)
        return text

    def default(self, r: ResolvedOption) -> Any:
        return None if self.defaults is None else field_value(self.defaults, r.option.path)

    def parameters(self) -> list[inspect.Parameter]:
        return [
            inspect.Parameter(
                r.param,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=typer.Option(self.default(r), r.flag, help=self.help(r)),
                annotation=r.cli_type(),
            )
            for r in self.resolved
        ]

    def add_to(self, *, before: str) -> Callable[[F], F]:
        """Decorator: the command's signature with these options inserted before its parameter
        `before`; the command takes them as `**options`."""

        def decorate(func: F) -> F:
            signature = inspect.signature(func)
            hints = typing.get_type_hints(func)
            own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
            at = [p.name for p in own].index(before)
            params = [*own[:at], *self.parameters(), *own[at:]]
            func.__signature__ = signature.replace(  # type: ignore[attr-defined]
                parameters=[p.replace(annotation=hints.get(p.name, p.annotation)) for p in params]
            )
            func.__annotations__ = {p.name: p.annotation for p in params}
            return func

        return decorate

    def given(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """{field path: value} of the options the command got (None, an option not given, is left
        out), each parsed to its field's value."""
        out: dict[str, Any] = {}
        for r in self.resolved:
            value = options.get(r.param)
            if value is not None:
                out[r.option.path] = r.option.parse(value) if r.option.parse is not None else value
        return out
