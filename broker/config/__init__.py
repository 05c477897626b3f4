"""The XML configuration: one file configures the broker (SPEC section 4).

A package of small modules, each with one concern; import the public names from here:

* :mod:`~plugbroker.config.errors`: :class:`ConfigError`, located at file, line and element;
* :mod:`~plugbroker.config.units`: durations and sizes as written in the file;
* :mod:`~plugbroker.config.schema`: XML syntax and the XML Schema ``config/plugbroker.xsd``, with
  lxml's messages turned into located, readable errors;
* :mod:`~plugbroker.config.model`: the immutable model (:class:`BrokerConfig`, :class:`VhostConfig`,
  ...) and per-queue policy resolution (:meth:`VhostConfig.resolve`);
* :mod:`~plugbroker.config.registry`: :class:`ConfigElementRegistry`, the elements, policies and
  backoff types plugins add to the language;
* :mod:`~plugbroker.config.context`: :class:`ParseContext`, the helpers every element parser uses;
* :mod:`~plugbroker.config.loader`: the walk over the core elements, and the entry points
  :func:`load_config`, :func:`parse_config` and :func:`load_default`.

The package knows no policy. The sections of the built-in plugins (``<consumer>``,
``<isolation>``, ``<deadLetter>``) are parsed by those plugins (``plugins/*_config.py``),
registered through the ``broker_add_config_elements`` hook like any third-party section.
"""

from __future__ import annotations

from plugbroker.config.context import OptionCheck, ParseContext, SectionScope
from plugbroker.config.errors import ConfigError
from plugbroker.config.loader import builtin_registry, load_config, load_default, parse_config
from plugbroker.config.model import (
    DEFAULT_TOPIC_EXCHANGE,
    BlastRadiusConfig,
    BrokerConfig,
    ExchangeDecl,
    Limits,
    PolicyRef,
    QueueConfig,
    ResolvedPolicy,
    Sections,
    TlsConfig,
    TopicConfig,
    TopicMatcher,
    UnparsedSection,
    User,
    VhostConfig,
)
from plugbroker.config.registry import (
    REACH_ANY,
    REACH_TOPIC_SUBSCRIPTIONS,
    ConfigElementRegistry,
    ElementParser,
    RegistryLike,
)
from plugbroker.config.schema import default_config_path, schema_path
from plugbroker.subscription import SUBSCRIPTION_TYPES

__all__ = [
    "DEFAULT_TOPIC_EXCHANGE",
    "REACH_ANY",
    "REACH_TOPIC_SUBSCRIPTIONS",
    "SUBSCRIPTION_TYPES",
    "BlastRadiusConfig",
    "BrokerConfig",
    "ConfigElementRegistry",
    "ConfigError",
    "ElementParser",
    "ExchangeDecl",
    "Limits",
    "OptionCheck",
    "ParseContext",
    "PolicyRef",
    "QueueConfig",
    "RegistryLike",
    "ResolvedPolicy",
    "SectionScope",
    "Sections",
    "TlsConfig",
    "TopicConfig",
    "TopicMatcher",
    "UnparsedSection",
    "User",
    "VhostConfig",
    "builtin_registry",
    "default_config_path",
    "load_config",
    "load_default",
    "parse_config",
    "schema_path",
]
