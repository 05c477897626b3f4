"""Users: password hashes in RabbitMQ's format, per-vhost permissions, tags, loopback.

A password hash is what ``rabbitmqctl hash_password`` prints and what RabbitMQ's definitions
export holds: base64 of a 4-byte random salt followed by ``H(salt + password)``, where ``H`` is
SHA-256 (RabbitMQ's default, ``rabbit_password_hashing_sha256``) or SHA-512
(``hashingAlgorithm="sha512"``). A user exported from RabbitMQ therefore logs in unchanged.

A :class:`Permission` is RabbitMQ's configure/write/read triple for one vhost. Each pattern is a
regular expression *searched* in the resource name (RabbitMQ runs ``re:run`` on the name: it
matches anywhere unless the pattern is anchored with ``^`` and ``$``); the empty pattern means
"nothing" (RabbitMQ reads it as ``^$``). Which operation needs which permission on which
resource is the session's business (:mod:`plugbroker.session`); this module only answers "may this
user do *kind* on a resource named *name*".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_HASHING_ALGORITHM",
    "FULL_PATTERN",
    "HASHING_ALGORITHMS",
    "KNOWN_TAGS",
    "Permission",
    "PermissionKind",
    "compile_pattern",
    "decode_password_hash",
    "hash_password",
    "is_loopback",
    "warn_plain_passwords",
]

log = logging.getLogger("plugbroker.config")

#: hashingAlgorithm -> hash function (RabbitMQ's rabbit_password_hashing_sha256 / _sha512)
HASHING_ALGORITHMS: dict[str, Callable[[bytes], hashlib._Hash]] = {
    "sha256": hashlib.sha256,
    "sha512": hashlib.sha512,
}
DEFAULT_HASHING_ALGORITHM = "sha256"
#: bytes of salt in front of the digest (RabbitMQ: a 32-bit random salt)
SALT_BYTES = 4

#: the tags RabbitMQ's management plugin knows; ``tags=`` accepts these only
KNOWN_TAGS: frozenset[str] = frozenset(
    {"administrator", "monitoring", "policymaker", "management", "impersonator"}
)

#: the pattern ``vhosts="..."`` grants for configure, write and read
FULL_PATTERN = ".*"

PermissionKind = str  # "configure" | "write" | "read"


def hash_password(
    password: str, algorithm: str = DEFAULT_HASHING_ALGORITHM, salt: bytes | None = None
) -> str:
    """A ``passwordHash`` value for ``password``: base64(salt + H(salt + password)).

    :param salt: 4 bytes; random when not given (tests pass one to get a known vector).
    """
    fn = HASHING_ALGORITHMS[algorithm]
    if salt is None:
        salt = os.urandom(SALT_BYTES)
    if len(salt) != SALT_BYTES:
        raise ValueError(f"the salt must be {SALT_BYTES} bytes")
    digest = fn(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def decode_password_hash(value: str, algorithm: str = DEFAULT_HASHING_ALGORITHM) -> bytes:
    """The salt + digest bytes of a ``passwordHash``; ValueError says what is wrong."""
    fn = HASHING_ALGORITHMS[algorithm]
    try:
        raw = base64.b64decode(value.strip().encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("not base64") from None
    want = SALT_BYTES + fn(b"").digest_size
    if len(raw) != want:
        raise ValueError(
            f"decodes to {len(raw)} bytes; a {algorithm} hash is {want} "
            f"({SALT_BYTES} of salt and {fn(b'').digest_size} of digest)"
        )
    return raw


def check_password_hash(
    password: str, stored: bytes, algorithm: str = DEFAULT_HASHING_ALGORITHM
) -> bool:
    """Whether ``password`` hashes to ``stored`` (salt + digest), compared in constant time."""
    salt, digest = stored[:SALT_BYTES], stored[SALT_BYTES:]
    mine = HASHING_ALGORITHMS[algorithm](salt + password.encode("utf-8")).digest()
    return hmac.compare_digest(mine, digest)


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """RabbitMQ's reading of a permission pattern: the empty one matches no name at all.

    Raises ``re.error`` for a pattern that does not compile.
    """
    return re.compile(pattern if pattern else "^$")


@dataclass(frozen=True, slots=True)
class Permission:
    """configure / write / read patterns of one user on one vhost (RabbitMQ's semantics)."""

    configure: str = FULL_PATTERN
    write: str = FULL_PATTERN
    read: str = FULL_PATTERN
    _compiled: dict[str, re.Pattern[str]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        for kind in ("configure", "write", "read"):
            self._compiled[kind] = compile_pattern(getattr(self, kind))

    def allows(self, kind: PermissionKind, name: str) -> bool:
        """Whether the ``kind`` pattern matches (anywhere in) the resource ``name``."""
        return self._compiled[kind].search(name) is not None

    def pattern(self, kind: PermissionKind) -> str:
        return str(getattr(self, kind))

    def describe(self) -> str:
        return f"configure {self.configure!r} write {self.write!r} read {self.read!r}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address as the socket gives it) is 127.0.0.0/8 or ::1 (an IPv4
    address mapped into IPv6 counts as IPv4)."""
    host = host.strip().strip("[]").split("%", 1)[0]
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


_warned_plain: set[str] = set()


def warn_plain_passwords(users: Iterable[tuple[str, bool]], source: object) -> None:
    """Log once per user name that a plain-text ``password=`` is in use.

    :param users: ``(name, has plain password)`` pairs.
    """
    for name, plain in users:
        if plain and name not in _warned_plain:
            _warned_plain.add(name)
            log.warning(
                "user %r in %s has a plain-text password=; store passwordHash= instead "
                "(plugbroker hash-password prints one)",
                name,
                source,
            )
