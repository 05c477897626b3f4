"""The XML Schema pass: reading the file safely, validating it against ``config/plugbroker.xsd``,
and turning lxml's messages into located, readable :class:`ConfigError` s.

Two of the loader's three passes live here:

1. XML syntax (:func:`parse_xml`: lxml, with entity expansion, DTDs and network access off);
2. the schema (:func:`validate`): shapes and types. Every schema error of the file is reported
   at once (``ConfigError.more``), each as ``file:line: <element>: message``.

The schema itself is read once. Its declarations are also read back as data (:class:`Shape`) so
that messages such as "expected one of: ..." list exactly what the schema accepts, and so that
the loader knows which elements the schema declares (:func:`declared_elements`).

The core's own element names (:data:`BROKER_CHILDREN`, :data:`VHOST_CHILDREN`) are defined here
too: the loader places them, and the element registry keeps plugins from taking them.
"""

from __future__ import annotations

import difflib
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType
from typing import Any

from lxml import etree

from plugbroker.config.errors import ConfigError
from plugbroker.config.units import (
    DURATION_PATTERN,
    SIZE_PATTERN,
    parse_duration,
    parse_duration_list,
    parse_size,
)

__all__ = [
    "BROKER_CHILDREN",
    "BROKER_SINGLETONS",
    "CORE_ELEMENTS",
    "VHOST_CHILDREN",
    "Shape",
    "config_dir",
    "declared_elements",
    "default_config_path",
    "parse_xml",
    "schema_path",
    "suggest",
    "validate",
]

#: the elements directly under ``<broker>`` that may appear at most once
BROKER_SINGLETONS: tuple[str, ...] = (
    "listen",
    "store",
    "users",
    "housekeeping",
    "plugins",
    "journal",
    "limits",
    "admin",
    "tls",
)
#: every core element directly under ``<broker>``
BROKER_CHILDREN: tuple[str, ...] = (*BROKER_SINGLETONS, "virtualhost")
#: the core elements directly under ``<virtualhost>``
VHOST_CHILDREN: tuple[str, ...] = ("exchange", "queue", "topic", "blastRadius")
#: element names the core parses itself; no plugin may register one of them
CORE_ELEMENTS: frozenset[str] = frozenset((*BROKER_CHILDREN, *VHOST_CHILDREN, "broker"))

# ---------------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------------


#: ``config/`` of the source tree, installed as this package (pyproject.toml's package-dir)
DATA_PACKAGE = "plugbroker.config_data"


def config_file(name: str) -> Traversable:
    """A file of ``config/`` (the schema, the default configuration), wherever the code runs.

    The one lookup, through :mod:`importlib.resources`: first ``config/`` beside the package's
    folder (a checkout: beside broker/), then the package data :data:`DATA_PACKAGE` (a wheel,
    installed or given to ``spark-submit --py-files`` as a zip; a strict editable install).
    When neither has it, the first place is returned, so an error names it.
    """
    from importlib import resources

    here = resources.files("plugbroker")
    parent = getattr(here, "parent", None)  # a directory (pathlib) or a zip folder (zipfile)
    beside = parent.joinpath("config", name) if parent is not None else None
    if beside is not None and beside.is_file():
        return beside  # type: ignore[no-any-return]
    try:
        installed = resources.files(DATA_PACKAGE).joinpath(name)
    except ModuleNotFoundError:
        installed = None
    if installed is not None and installed.is_file():
        # a strict editable install links the files: name the real one (the checkout's config/)
        return installed.resolve() if isinstance(installed, Path) else installed
    return beside if beside is not None else here.joinpath("..", "config", name)


def config_dir() -> Path:
    """``config/`` in the source tree, next to broker/, the ``plugbroker`` package (on disk)."""
    return Path(str(config_file("plugbroker.xsd"))).parent


def schema_path() -> Path:
    """Where ``config/plugbroker.xsd`` is (for messages; read it through :func:`config_file`)."""
    return Path(str(config_file("plugbroker.xsd")))


def default_config_path() -> Path:
    """``config/default.xml``, the config the README's run command uses."""
    return Path(str(config_file("default.xml")))


# ---------------------------------------------------------------------------------------------
# The schema, and what it declares
# ---------------------------------------------------------------------------------------------

_XS = "{http://www.w3.org/2001/XMLSchema}"


@dataclass(frozen=True)
class Shape:
    """What the schema declares for one element: child elements, attributes, required children."""

    children: tuple[str, ...]
    attributes: tuple[str, ...]
    required: tuple[str, ...]


_schema_lock = threading.Lock()


@dataclass(frozen=True)
class _Schema:
    schema: etree.XMLSchema
    #: (parent element or None for global, element) -> (child element names, attribute names)
    shapes: Mapping[tuple[str | None, str], Shape]

    def shape(self, parent: str | None, name: str) -> Shape | None:
        return self.shapes.get((parent, name)) or self.shapes.get((None, name))


@lru_cache(maxsize=1)
def _load_schema() -> _Schema:
    source = config_file("plugbroker.xsd")
    try:
        with source.open("rb") as fh:
            doc = etree.parse(fh)
    except (OSError, etree.XMLSyntaxError) as exc:  # a broken install, not a user error
        raise ConfigError(
            f"cannot read the configuration schema: {exc}", file=str(source)
        ) from None
    return _Schema(etree.XMLSchema(doc), MappingProxyType(_schema_shapes(doc.getroot())))


def _schema_shapes(root: Any) -> dict[tuple[str | None, str], Shape]:
    """Which children and attributes each element declares, read from the XSD itself.

    Used to word errors ("expected one of ...") and to tell which elements the schema declares,
    so neither can drift from the schema.
    """
    named = {ct.get("name"): ct for ct in root.findall(f"{_XS}complexType")}
    groups = {g.get("name"): g for g in root.findall(f"{_XS}group")}
    shapes: dict[tuple[str | None, str], Shape] = {}
    containers = {
        f"{_XS}{n}"
        for n in (
            "sequence",
            "all",
            "choice",
            "complexContent",
            "simpleContent",
            "extension",
            "restriction",
        )
    }

    def visit(decl: Any, parent: str | None) -> None:
        name = decl.get("name")
        ct = decl.find(f"{_XS}complexType")
        if ct is None and decl.get("type"):
            ct = named.get(decl.get("type").split(":")[-1])
        if name is None or ct is None:
            return
        children: list[str] = []
        attrs: list[str] = []
        required: list[str] = []

        def walk(node: Any, optional: bool) -> None:
            for n in node:
                opt = optional or n.get("minOccurs") == "0"
                if n.tag == f"{_XS}element":
                    children.append(n.get("name") or n.get("ref"))
                    if not opt:
                        required.append(children[-1])
                    visit(n, name)
                elif n.tag == f"{_XS}attribute":
                    attrs.append(n.get("name"))
                elif n.tag == f"{_XS}group" and n.get("ref") in groups:
                    walk(groups[n.get("ref")], opt)
                elif n.tag in containers:
                    # no single alternative of a choice is required on its own
                    walk(n, opt or n.tag == f"{_XS}choice")

        walk(ct, False)
        shapes[(parent, name)] = Shape(tuple(children), tuple(attrs), tuple(required))

    for decl in root.findall(f"{_XS}element"):
        visit(decl, None)
    return shapes


# ---------------------------------------------------------------------------------------------
# Turning lxml messages into located, readable errors
# ---------------------------------------------------------------------------------------------

# libxml2's schema messages, as lxml passes them on (libxml2 2.9 - 2.14 word them alike)
_PREFIX_RE = re.compile(
    r"^Element '(?P<el>[^']+)'(?:, attribute '(?P<attr>[^']+)')?: (?P<rest>.*)$", re.DOTALL
)
_PATTERN_RE = re.compile(
    r"^\[facet 'pattern'\] The value '(?P<v>.*)' is not accepted by the pattern '(?P<p>.*)'\.$",
    re.DOTALL,
)
_ENUM_RE = re.compile(
    r"^\[facet 'enumeration'\] The value '(?P<v>.*)' is not an element of the set "
    r"\{(?P<set>.*)\}\.$",
    re.DOTALL,
)
_ATOMIC_RE = re.compile(
    r"^'(?P<v>.*)' is not a valid value of the (?:local )?(?:atomic|list) type "
    r"'(?P<t>[^']+)'\.$",
    re.DOTALL,
)
_LENGTH_RE = re.compile(
    r"^\[facet '(?:minLength|length)'\] The value '(?P<v>.*)' has a length of '0'", re.DOTALL
)
_MAXLEN_RE = re.compile(
    r"^\[facet 'maxLength'\] The value .* has a length of '(?P<n>\d+)'; this exceeds the "
    r"allowed maximum length of '(?P<m>\d+)'",
    re.DOTALL,
)
_NOT_EXPECTED_RE = re.compile(
    r"^This element is not expected\.(?: Expected is (?:one of )?\( (?P<exp>.*) \)\.)?$", re.DOTALL
)
_MISSING_RE = re.compile(
    r"^Missing child element\(s\)\. Expected is (?:one of )?\( (?P<exp>.*) \)\.$", re.DOTALL
)
_ATTR_MISSING_RE = re.compile(r"^The attribute '(?P<a>[^']+)' is required but missing\.$")
_ATTR_UNKNOWN_RE = re.compile(r"^The attribute '(?P<a>[^']+)' is not allowed\.$")

_IDENT_HINT = "a name such as my_company.policies, Delete or exponential"
_TYPE_HINTS = {
    "xs:boolean": "is not true or false",
    "xs:positiveInteger": "is not a whole number of 1 or more",
    "xs:nonNegativeInteger": "is not a whole number of 0 or more",
    "xs:unsignedShort": "is not a whole number from 0 to 65535",
    "xs:decimal": "is not a decimal number (like 0.6 or 100)",
    "xs:integer": "is not a whole number",
}


def _value_message(value: str, type_or_pattern: str) -> str:
    """The message for a value the schema refused, in units.py's words where it applies."""
    try:
        if type_or_pattern in (DURATION_PATTERN, "durationType"):
            parse_duration(value)
        elif type_or_pattern in (SIZE_PATTERN, "sizeType"):
            parse_size(value)
        elif type_or_pattern in ("durationListType", "durationListItems"):
            parse_duration_list(value)
    except ValueError as exc:
        return str(exc)
    if type_or_pattern in _TYPE_HINTS:
        return f"{value!r} {_TYPE_HINTS[type_or_pattern]}"
    if type_or_pattern == "identifierType" or "A-Za-z_" in type_or_pattern:
        return f"{value!r} is not a valid name ({_IDENT_HINT})"
    return f"{value!r} is not a valid {type_or_pattern}"


def _find_path(root: Any, path: str | None) -> Any | None:
    """The element an lxml error path (``/broker/virtualhost[2]/queue``) points at."""
    if not path:
        return None
    try:
        found = root.getroottree().xpath(path)
    except etree.XPathError:
        return None
    return found[0] if found else None


def suggest(name: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f"; did you mean <{close[0]}>?" if close else ""


def _schema_error(entry: Any, source: str, schema: _Schema, root: Any) -> ConfigError:
    steps = [re.sub(r"\[\d+\]$", "", s) for s in (entry.path or "").split("/") if s]
    m = _PREFIX_RE.match(entry.message.strip())
    element = m["el"] if m else (steps[-1] if steps else None)
    attr = m["attr"] if m else None
    rest = m["rest"].strip() if m else entry.message.strip()
    parent = steps[-2] if len(steps) >= 2 else None
    msg = rest
    if (mm := _PATTERN_RE.match(rest)) is not None:
        msg = _value_message(mm["v"], mm["p"])
    elif (mm := _ENUM_RE.match(rest)) is not None:
        allowed = re.findall(r"'([^']*)'", mm["set"])
        msg = f"{mm['v']!r} is not one of: {', '.join(allowed)}"
    elif (mm := _ATOMIC_RE.match(rest)) is not None:
        msg = _value_message(mm["v"], mm["t"])
    elif _LENGTH_RE.match(rest):
        msg = "must not be empty"
    elif (mm := _MAXLEN_RE.match(rest)) is not None:
        msg = f"is {mm['n']} characters long; at most {mm['m']} are allowed"
    elif (mm := _NOT_EXPECTED_RE.match(rest)) is not None:
        shape = schema.shape(steps[-3] if len(steps) >= 3 else None, parent) if parent else None
        expected = (
            list(shape.children)
            if shape and shape.children
            else ([e.strip() for e in mm["exp"].split(",")] if mm["exp"] else [])
        )
        where = f" under <{parent}>" if parent else ""
        if element in expected:
            msg = f"<{element}> appears more than once{where}"
        else:
            msg = f"unexpected element <{element}>{where}"
            if expected:
                msg += f"; expected one of: {', '.join(expected)}"
            msg += suggest(element or "", expected)
    elif (mm := _MISSING_RE.match(rest)) is not None:
        shape = schema.shape(parent, element or "")
        target = _find_path(root, entry.path)
        missing: list[str] = []
        if shape is not None and target is not None:
            missing = [c for c in shape.required if target.find(c) is None]
        if missing:
            msg = f"missing required child element <{missing[0]}>"
        else:
            msg = f"missing child element; expected one of: {mm['exp']}"
    elif rest.startswith("Character content other than whitespace is not allowed"):
        msg = "text is not allowed here, only child elements"
    elif (mm := _ATTR_MISSING_RE.match(rest)) is not None:
        msg = f"attribute {mm['a']} is required"
    elif (mm := _ATTR_UNKNOWN_RE.match(rest)) is not None:
        shape = schema.shape(parent, element or "")
        allowed = list(shape.attributes) if shape else []
        msg = f"unknown attribute {mm['a']!r}"
        if allowed:
            msg += f"; allowed: {', '.join(allowed)}"
        else:
            msg += "; this element takes no attributes"
        close = difflib.get_close_matches(mm["a"], allowed, n=1, cutoff=0.6)
        if close:
            msg += f"; did you mean {close[0]!r}?"
        attr = None
    if attr:
        msg = f"attribute {attr}: {msg}"
    return ConfigError(msg, file=source, line=entry.line or None, element=element)


_SyntaxRender = Callable[["re.Match[str]"], tuple[str, str]]
#: libxml2 syntax messages that name an element -> (element, message for the user)
_SYNTAX_PATTERNS: tuple[tuple[re.Pattern[str], _SyntaxRender], ...] = (
    (
        re.compile(
            r"Opening and ending tag mismatch: (?P<a>\S+) line (?P<l>\d+) and (?P<b>[^,\s]+)"
        ),
        lambda m: (m["a"], f"<{m['a']}> (opened on line {m['l']}) is closed by </{m['b']}>"),
    ),
    (
        re.compile(r"Premature end of data in tag (?P<a>\S+) line (?P<l>\d+)"),
        lambda m: (m["a"], f"the file ends before <{m['a']}> (opened on line {m['l']}) is closed"),
    ),
    (
        re.compile(r"Couldn't find end of Start Tag (?P<a>\S+) line"),
        lambda m: (m["a"], f"the start tag <{m['a']}> is not finished (check quotes and '>')"),
    ),
)


def _syntax_error(exc: etree.XMLSyntaxError, source: str, log: Any) -> ConfigError:
    entries = list(log) if log else []
    raw = entries[0].message if entries else str(exc.msg)
    line = entries[0].line if entries else exc.lineno
    # libxml2's first message is usually the root cause; prefer one that names an element
    for entry in entries or []:
        for rx, render in _SYNTAX_PATTERNS:
            m = rx.search(entry.message)
            if m:
                element, text = render(m)
                return ConfigError(
                    f"malformed XML: {text}", file=source, line=entry.line, element=element
                )
    text = re.sub(r", line \d+, column \d+$", "", raw.strip())
    return ConfigError(f"malformed XML: {text}", file=source, line=line or None)


# ---------------------------------------------------------------------------------------------
# The two passes
# ---------------------------------------------------------------------------------------------

_PARSER_OPTS: dict[str, bool] = {
    "resolve_entities": False,  # no entity expansion (billion laughs) and no external entities
    "no_network": True,
    "load_dtd": False,
    "huge_tree": False,
    "remove_comments": False,
}


def parse_xml(text: bytes | str, source_name: str) -> Any:
    """Pass 1: the document's root element.

    :raises ConfigError: for malformed XML or an empty document, located where lxml found it.
    """
    data = text.encode("utf-8") if isinstance(text, str) else text
    if isinstance(text, str):
        # lxml refuses str input that carries an encoding declaration; we just encoded to UTF-8
        data = re.sub(rb"^(\s*<\?xml[^>]*?)\s+encoding=([\"'])[^\"']*\2", rb"\1", data, count=1)
    parser = etree.XMLParser(**_PARSER_OPTS)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as exc:
        raise _syntax_error(exc, source_name, parser.error_log) from None
    if root is None:
        raise ConfigError("malformed XML: the document is empty", file=source_name, line=1)
    return root


def validate(root: Any, source_name: str) -> None:
    """Pass 2: check ``root`` against the schema.

    :raises ConfigError: the first schema error, with the others in ``more``.
    """
    schema = _load_schema()
    with _schema_lock:  # an XMLSchema keeps its error log on the object
        valid = schema.schema.validate(root)
        entries = list(schema.schema.error_log)
    if valid:
        return
    errors: list[ConfigError] = []
    seen: set[tuple[int, str, str | None]] = set()
    for entry in entries:
        # lxml reports a bad pattern value twice (facet, then type): keep the first per spot
        m = _PREFIX_RE.match(entry.message.strip())
        key = (entry.line, entry.path or "", m["attr"] if m else None)
        if key in seen:
            continue
        seen.add(key)
        errors.append(_schema_error(entry, source_name, schema, root))
    if not errors:  # pragma: no cover - validate() said no but logged nothing
        raise ConfigError("does not match the configuration schema", file=source_name)
    first = errors[0]
    raise ConfigError(
        first.message,
        file=first.file,
        line=first.line,
        element=first.element,
        more=tuple(errors[1:]),
    )


def declared_elements() -> frozenset[str]:
    """The elements the schema declares globally: the core's and the built-in sections' shapes.

    Under the open containers' lax wildcard such an element is validated strictly against its
    declaration; any other element there passes the schema and is left to a plugin's parser.
    """
    return frozenset(name for parent, name in _load_schema().shapes if parent is None)
