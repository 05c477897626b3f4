"""The names plugins add to the configuration language, and the parsers for their elements.

The plugin host fills a :class:`ConfigElementRegistry` through the ``broker_add_config_elements``
hook before the file is parsed (and again before every reload). The built-in plugins register
their sections here exactly as a third-party plugin does: the core parses none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from plugbroker.config.schema import CORE_ELEMENTS

if TYPE_CHECKING:
    from plugbroker.config.context import ParseContext

__all__ = [
    "REACH_ANY",
    "REACH_TOPIC_SUBSCRIPTIONS",
    "ConfigElementRegistry",
    "ElementParser",
    "RegistryLike",
]

ElementParser = Callable[[Any, "ParseContext"], object]
"""``(lxml_element, ctx) -> parsed object``; raise ``ctx.error(el, msg)`` on bad input."""

#: the levels an element can be registered at
LEVELS = ("section", "broker")

#: a section's reach: under ``<virtualhost>`` or ``<topic>`` it reaches every queue they cover
REACH_ANY = "any"
#: a section's reach: under ``<virtualhost>`` or ``<topic>`` it reaches topic subscriptions only
#: (queues bound to a topic exchange that are not dead-letter or retry targets); under
#: ``<queue name>`` it reaches that queue, as any section does. The slow-consumer ``<consumer>``
#: has this reach (SPEC 4, the Qpid design).
REACH_TOPIC_SUBSCRIPTIONS = "topic-subscriptions"
REACHES = (REACH_ANY, REACH_TOPIC_SUBSCRIPTIONS)


class RegistryLike(Protocol):
    """What the loader needs from a registry; :class:`ConfigElementRegistry` has it all.

    Only ``config_element`` is required; the others are looked up with ``getattr`` and count as
    "nothing registered" when missing.
    """

    def config_element(self, name: str) -> ElementParser | None: ...


class ConfigElementRegistry:
    """Names plugins added to the configuration language, and the parsers for their elements.

    Two levels exist:

    * ``"section"``: an element under ``<virtualhost>``, ``<queue>`` or ``<topic>``; its parsed
      value resolves per queue and shows up in :class:`~plugbroker.config.ResolvedPolicy` under the
      element's name (``<consumer>``, ``<isolation>`` and ``<deadLetter>`` are sections of the
      built-in plugins).
    * ``"broker"``: an element directly under ``<broker>`` (broker-wide settings such as an admin
      endpoint); its parsed value lands in :attr:`BrokerConfig.extensions`.

    Policy names (``<policy name=...>``) and backoff types (``<backoff type=...>``) that plugins
    implement are recorded here too, so that a section's parser can refuse a typo in either
    (:meth:`ParseContext.knows_policy`) rather than leave a policy that never fires.
    """

    def __init__(self) -> None:
        self._sections: dict[str, ElementParser] = {}
        self._broker: dict[str, ElementParser] = {}
        self._policies: set[str] = set()
        self._backoffs: set[str] = set()
        self._topic_only: set[str] = set()

    def register(
        self, name: str, parser: ElementParser, *, level: str = "section", reach: str = REACH_ANY
    ) -> None:
        """Register ``parser`` for element ``name``.

        ``reach`` (sections only) says which queues the section reaches from ``<virtualhost>``
        and ``<topic>``: :data:`REACH_ANY` (every queue they cover) or
        :data:`REACH_TOPIC_SUBSCRIPTIONS` (topic subscriptions only; see
        :meth:`plugbroker.config.VhostConfig.resolve`).

        :raises ValueError: for a core element's name, a name already registered, a bad level or
            a bad reach.
        :raises TypeError: ``parser`` is not callable.
        """
        if level not in LEVELS:
            raise ValueError(f"level must be 'section' or 'broker', not {level!r}")
        if reach not in REACHES or (level != "section" and reach != REACH_ANY):
            raise ValueError(
                f"reach must be one of {', '.join(REACHES)} (and {REACH_ANY!r} for a broker "
                f"element), not {reach!r}"
            )
        if not name or name in CORE_ELEMENTS:
            raise ValueError(f"<{name}> is a built-in element and cannot be registered by a plugin")
        if name in self._sections or name in self._broker:
            raise ValueError(f"<{name}> is already registered by another plugin")
        if not callable(parser):
            raise TypeError(f"the parser for <{name}> must be callable")
        (self._sections if level == "section" else self._broker)[name] = parser
        if reach == REACH_TOPIC_SUBSCRIPTIONS:
            self._topic_only.add(name)

    def register_policy(self, name: str) -> None:
        """Declare that a plugin implements the policy ``name`` (registering it again is a no-op).

        :raises ValueError: for an empty name, or one that differs only in case from a policy
            already registered (``<policy name>`` may be matched without regard to case).
        """
        self._add_name(self._policies, "policy", name)

    def register_backoff(self, name: str) -> None:
        """Declare that a plugin implements the nack backoff type ``name`` (again: a no-op).

        :raises ValueError: for an empty name.
        """
        self._add_name(self._backoffs, "backoff type", name, fold_case=False)

    @staticmethod
    def _add_name(names: set[str], what: str, name: str, *, fold_case: bool = True) -> None:
        if not name:
            raise ValueError(f"a {what} needs a name")
        if name in names:
            return
        if fold_case:
            clash = next((n for n in names if n.lower() == name.lower()), None)
            if clash is not None:
                raise ValueError(f"{what} {name!r} differs only in case from {clash!r}")
        names.add(name)

    def get(self, name: str) -> ElementParser | None:
        """The parser registered for section element ``name``, or ``None``."""
        return self._sections.get(name)

    config_element = get

    def broker_element(self, name: str) -> ElementParser | None:
        """The parser registered for broker-level element ``name``, or ``None``."""
        return self._broker.get(name)

    def has_policy(self, name: str) -> bool:
        return name in self._policies

    def policy_names(self) -> tuple[str, ...]:
        """The policies plugins registered, sorted."""
        return tuple(sorted(self._policies))

    def has_backoff(self, name: str) -> bool:
        return name in self._backoffs

    @property
    def section_names(self) -> frozenset[str]:
        return frozenset(self._sections)

    @property
    def broker_names(self) -> frozenset[str]:
        return frozenset(self._broker)

    @property
    def topic_only_sections(self) -> frozenset[str]:
        """Sections registered with :data:`REACH_TOPIC_SUBSCRIPTIONS`."""
        return frozenset(self._topic_only)
