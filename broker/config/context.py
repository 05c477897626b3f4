"""What element parsers (the core's and every plugin's) get: :class:`ParseContext`.

A parser is ``parser(el, ctx) -> value`` (see :class:`~plugbroker.config.ConfigElementRegistry`).
``ctx`` turns text into values (durations, sizes, numbers, booleans, level lists) and raises a
:class:`ConfigError` located at the element that holds a bad one, so that a plugin's messages
read exactly like the core's: ``file:line: <element>: message``. It also reads a section's
``<policy>`` (:meth:`ParseContext.policy`), tells a parser where its element sits
(:meth:`ParseContext.scope`) and whether a policy or backoff name is registered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from math import isfinite
from typing import Any, TypeVar, overload

from plugbroker.config.errors import ConfigError
from plugbroker.config.model import XML_FALSE, XML_TRUE, PolicyRef, frozen_map
from plugbroker.config.registry import RegistryLike
from plugbroker.config.units import (
    format_duration,
    format_size,
    parse_duration,
    parse_duration_list,
    parse_size,
)

__all__ = ["OptionCheck", "ParseContext", "SectionScope", "children", "local_name", "quote"]


log = logging.getLogger("plugbroker.config")


def quote(value: str) -> str:
    """An attribute value quoted as it would be written in the file."""
    return f'"{value}"' if '"' not in value else f"'{value}'"


def local_name(el: Any) -> str:
    """The element name to show a user (namespace dropped)."""
    tag = el.tag
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else str(tag)


def children(el: Any) -> Iterator[Any]:
    """Child elements, skipping comments and processing instructions."""
    return (c for c in el if isinstance(c.tag, str))


@dataclass(frozen=True, slots=True)
class SectionScope:
    """Where a section element sits: its container's name and attributes.

    ``kind`` is ``"virtualhost"``, ``"queue"`` or ``"topic"``; ``attributes`` are the container's
    attributes as written (``name``, ``subscription``, ``key``, ...).
    """

    kind: str
    attributes: Mapping[str, str]

    @property
    def queue(self) -> str | None:
        """The queue's name when the section sits in a ``<queue>``, else ``None``."""
        return self.attributes.get("name") if self.kind == "queue" else None


_T = TypeVar("_T")

OptionCheck = Callable[[Any, str, str], str]
"""``check(option_el, name, value) -> value to keep``; raise ``ctx.error(option_el, ...)``."""


class ParseContext:
    """Helpers for element parsers (the core's and the plugins') that turn text into values.

    Every helper reads either the text of child element ``child`` of ``el`` or, with
    ``child=None``, the text of ``el`` itself; a missing child yields ``default``. A bad value
    raises a :class:`ConfigError` located at the element that holds it.
    """

    def __init__(self, source: str, registry: RegistryLike | None = None) -> None:
        self.source = source
        self.registry = registry

    # -- errors -------------------------------------------------------------------------------

    def error(self, el: Any, message: str) -> ConfigError:
        """A :class:`ConfigError` located at ``el`` (raise it)."""
        return ConfigError(message, file=self.source, line=el.sourceline, element=local_name(el))

    # -- structure ----------------------------------------------------------------------------

    @staticmethod
    def children(el: Any) -> Iterator[Any]:
        """``el``'s child elements, skipping comments and processing instructions."""
        return children(el)

    def once(self, seen: dict[str, Any], el: Any, where: str) -> None:
        """Refuse a second element of ``el``'s name in one container.

        :param seen: element name -> the first such element met so far in the container; ``el``
            is added to it.
        :param where: how the container is named in the message, e.g. ``"<backoff>"``.
        """
        name = local_name(el)
        if name in seen:
            raise self.error(
                el,
                f"<{name}> appears more than once under {where} (first on line "
                f"{seen[name].sourceline})",
            )
        seen[name] = el

    def scope(self, el: Any) -> SectionScope:
        """The container of section element ``el`` (``<virtualhost>``, ``<queue>``, ``<topic>``)."""
        parent = el.getparent()
        if parent is None:
            return SectionScope("", frozen_map())
        return SectionScope(local_name(parent), frozen_map(dict(parent.attrib)))

    # -- names plugins registered -------------------------------------------------------------

    def knows_policy(self, name: str) -> bool:
        """Whether a plugin registered the policy ``name`` (exact spelling)."""
        has = getattr(self.registry, "has_policy", None) if self.registry is not None else None
        return bool(callable(has) and has(name))

    def registered_policies(self) -> tuple[str, ...]:
        """The policy names plugins registered (for a did-you-mean)."""
        names = getattr(self.registry, "policy_names", None) if self.registry is not None else None
        return tuple(names()) if callable(names) else ()

    def knows_backoff(self, name: str) -> bool:
        """Whether a plugin registered the nack backoff type ``name``."""
        has = getattr(self.registry, "has_backoff", None) if self.registry is not None else None
        return bool(callable(has) and has(name))

    # -- policy references --------------------------------------------------------------------

    def policy(
        self, el: Any, check_option: OptionCheck | None = None, *, name: str | None = None
    ) -> PolicyRef:
        """``<policy name><options><option name value/>...</options></policy>`` as a PolicyRef.

        An option given twice is refused. ``check_option`` (the section's own rules for the
        policies it implements) sees each option in document order and returns the value to
        keep. Whether anyone implements ``name`` is the section parser's question
        (:meth:`knows_policy`); the plugin host checks it again for every policy at load.

        :param name: the name to store instead of the written one (a canonical spelling).
        """
        options: dict[str, str] = {}
        lines: dict[str, int] = {}
        opts_el = el.find("options")
        for opt in children(opts_el) if opts_el is not None else ():
            oname = opt.get("name")
            if oname in lines:
                raise self.error(
                    opt,
                    f"option {oname!r} is given twice (first on line {lines[oname]})",
                )
            lines[oname] = opt.sourceline
            value = opt.get("value")
            options[oname] = check_option(opt, oname, value) if check_option else value
        return PolicyRef(name if name is not None else el.get("name"), frozen_map(options))

    # -- raw access ---------------------------------------------------------------------------

    def _target(self, el: Any, child: str | None) -> Any | None:
        return el if child is None else el.find(child)

    def _present(self, el: Any, child: str | None) -> bool:
        return child is None or el.find(child) is not None

    @overload
    def attr(self, el: Any, name: str, default: str) -> str: ...

    @overload
    def attr(self, el: Any, name: str, default: None = None) -> str | None: ...

    def attr(self, el: Any, name: str, default: str | None = None) -> str | None:
        value = el.get(name)
        return default if value is None else value

    @overload
    def text(self, el: Any, child: str | None, default: str) -> str: ...

    @overload
    def text(self, el: Any, child: str | None = None, default: None = None) -> str | None: ...

    def text(self, el: Any, child: str | None = None, default: str | None = None) -> str | None:
        target = self._target(el, child)
        if target is None:
            return default
        return (target.text or "").strip()

    def _convert(
        self, el: Any, child: str | None, default: _T | None, conv: Callable[[str], _T]
    ) -> _T | None:
        target = self._target(el, child)
        if target is None:
            return default
        try:
            return conv((target.text or "").strip())
        except ValueError as exc:
            raise self.error(target, str(exc)) from None

    def _warn_bare(
        self,
        el: Any,
        child: str | None,
        value: float | None,
        unit: str,
        render: Callable[[Any], str],
    ) -> None:
        """A bare number (``<period>30</period>``) keeps the Qpid meaning, milliseconds or
        bytes, which is rarely what a hand-written value means: say how it was read. Zero is
        the same in every unit and passes quietly."""
        target = self._target(el, child)
        if target is None or value is None:
            return
        text = (target.text or "").strip()
        if not text.isdigit() or int(text) == 0:
            return
        name = local_name(target)
        log.warning(
            "%s:%s: <%s>: bare number %s read as %s (%s); write the unit to say so, "
            "e.g. <%s>%s</%s>",
            self.source,
            target.sourceline,
            name,
            text,
            unit,
            render(value),
            name,
            render(value),
            name,
        )

    def _check_range(
        self,
        el: Any,
        child: str | None,
        value: float | None,
        minimum: float | None,
        maximum: float | None,
        render: Callable[[Any], str],
        *,
        exclusive_min: bool = False,
    ) -> None:
        if value is None:
            return
        target = self._target(el, child)
        if minimum is not None and (value <= minimum if exclusive_min else value < minimum):
            op = "greater than" if exclusive_min else "at least"
            raise self.error(
                target, f"{render(value)} is too small: it must be {op} {render(minimum)}"
            )
        if maximum is not None and value > maximum:
            raise self.error(
                target, f"{render(value)} is too large: it must be at most {render(maximum)}"
            )

    # -- typed helpers ------------------------------------------------------------------------

    @overload
    def duration(
        self,
        el: Any,
        child: str | None,
        default: float,
        *,
        minimum: float | None = ...,
        maximum: float | None = ...,
        allow_zero: bool = ...,
    ) -> float: ...

    @overload
    def duration(
        self,
        el: Any,
        child: str | None,
        default: None = None,
        *,
        minimum: float | None = ...,
        maximum: float | None = ...,
        allow_zero: bool = ...,
    ) -> float | None: ...

    def duration(
        self,
        el: Any,
        child: str | None,
        default: float | None = None,
        *,
        minimum: float | None = 0.0,
        maximum: float | None = None,
        allow_zero: bool = False,
    ) -> float | None:
        """Seconds from ``300000`` (ms) or ``5m``; by default a duration must be > 0."""
        value = self._convert(el, child, default, parse_duration)
        if self._present(el, child):  # defaults are the caller's, not the user's: not checked
            self._warn_bare(el, child, value, "milliseconds", format_duration)
            self._check_range(
                el,
                child,
                value,
                minimum,
                maximum,
                format_duration,
                exclusive_min=(not allow_zero and minimum == 0.0),
            )
        return value

    @overload
    def size(
        self,
        el: Any,
        child: str | None,
        default: int,
        *,
        minimum: int | None = ...,
        maximum: int | None = ...,
    ) -> int: ...

    @overload
    def size(
        self,
        el: Any,
        child: str | None,
        default: None = None,
        *,
        minimum: int | None = ...,
        maximum: int | None = ...,
    ) -> int | None: ...

    def size(
        self,
        el: Any,
        child: str | None,
        default: int | None = None,
        *,
        minimum: int | None = 0,
        maximum: int | None = None,
    ) -> int | None:
        """Bytes from ``4235264`` or ``4MB``."""
        value = self._convert(el, child, default, parse_size)
        if self._present(el, child):
            self._warn_bare(el, child, value, "bytes", format_size)
            self._check_range(el, child, value, minimum, maximum, format_size)
        return value

    @overload
    def integer(
        self,
        el: Any,
        child: str | None,
        default: int,
        *,
        minimum: int | None = ...,
        maximum: int | None = ...,
    ) -> int: ...

    @overload
    def integer(
        self,
        el: Any,
        child: str | None,
        default: None = None,
        *,
        minimum: int | None = ...,
        maximum: int | None = ...,
    ) -> int | None: ...

    def integer(
        self,
        el: Any,
        child: str | None,
        default: int | None = None,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        def conv(s: str) -> int:
            try:
                return int(s)
            except ValueError:
                raise ValueError(f"{s!r} is not a whole number") from None

        value = self._convert(el, child, default, conv)
        if self._present(el, child):
            self._check_range(el, child, value, minimum, maximum, str)
        return value

    @overload
    def number(
        self,
        el: Any,
        child: str | None,
        default: float,
        *,
        minimum: float | None = ...,
        maximum: float | None = ...,
        exclusive_min: bool = ...,
    ) -> float: ...

    @overload
    def number(
        self,
        el: Any,
        child: str | None,
        default: None = None,
        *,
        minimum: float | None = ...,
        maximum: float | None = ...,
        exclusive_min: bool = ...,
    ) -> float | None: ...

    def number(
        self,
        el: Any,
        child: str | None,
        default: float | None = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_min: bool = False,
    ) -> float | None:
        def conv(s: str) -> float:
            try:
                value = float(Decimal(s))
            except (ArithmeticError, ValueError):
                raise ValueError(f"{s!r} is not a number") from None
            if not isfinite(value):
                raise ValueError(f"{s!r} is not a finite number")
            return value

        value = self._convert(el, child, default, conv)
        if self._present(el, child):
            self._check_range(
                el, child, value, minimum, maximum, lambda v: f"{v:g}", exclusive_min=exclusive_min
            )
        return value

    def boolean(self, el: Any, child: str | None, default: bool | None = None) -> bool | None:
        def conv(s: str) -> bool:
            if s in XML_TRUE:
                return True
            if s in XML_FALSE:
                return False
            raise ValueError(f"{s!r} is not true or false")

        return self._convert(el, child, default, conv)

    @overload
    def durations(
        self, el: Any, child: str | None, default: tuple[float, ...]
    ) -> tuple[float, ...]: ...

    @overload
    def durations(
        self, el: Any, child: str | None, default: None = None
    ) -> tuple[float, ...] | None: ...

    def durations(
        self, el: Any, child: str | None, default: tuple[float, ...] | None = None
    ) -> tuple[float, ...] | None:
        """A whitespace-separated level list (``"1s 5s 10s"``) as seconds."""
        return self._convert(el, child, default, parse_duration_list)
