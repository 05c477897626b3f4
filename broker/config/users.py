"""Users: password hashes in RabbitMQ's format, per-vhost permissions, tags, loopback.

A password hash is what ``rabbitmqctl hash_password`` prints and what RabbitMQ's definitions
export holds: base64 of a 4-byte random salt followed by ``H(salt + password)``, where ``H`` is
SHA-256 (RabbitMQ's default, ``rabbit_password_hashing_sha256``) or SHA-512
(``hashingAlgorithm="sha512"``). A user exported from RabbitMQ therefore logs in unchanged.

A :class:`Permission` is RabbitMQ's configure/write/read triple for one vhost. Each pattern is a
regular expression *searched* in the resource name (RabbitMQ runs ``re:run`` on the name: it
matches anywhere unless the pattern is anchored with ``^`` and ``$``); the empty pattern means
"nothing" (RabbitMQ reads it as ``^$``). Which operation needs which permission on which
resource is :mod:`plugbroker.authz`'s business; this module only answers "may this user do
*kind* on a resource named *name*".

A pattern is an operator's, but the name it is matched against is a client's, and a pattern
that backtracks (``^(a|aa)+$``) can take seconds on a name of forty characters. So patterns are
matched with the ``regex`` package under a time bound (:data:`MATCH_TIMEOUT`): a match that runs
out of time (twice) refuses, logged, and never stalls the broker. At load, a pattern is tried against
a few hostile names made of its own characters (:func:`check_pattern_cost`), and one that runs
out of time there is refused with the file and line, so the bound is a safety net rather than
an everyday event.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import regex

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


#: seconds one try of a permission match may take; a match refuses when two tries run out of
#: time (a second try, so a scheduling pause in a match of microseconds never refuses)
MATCH_TIMEOUT = 0.002
#: seconds a pattern may take on one of the hostile names tried at load
LOAD_TIMEOUT = 0.02
#: permission matches that ran out of time, since start
timeouts_total = 0
_last_timeout_log = 0.0


def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """RabbitMQ's reading of a permission pattern: the empty one matches no name at all.

    Raises ``regex.error`` (``PatternError``) for a pattern that does not compile.
    """
    return regex.compile(pattern if pattern else "^$")


_LITERAL_PREFIX = regex.compile(r"\^?([A-Za-z0-9_:@/ -]*)")


def check_pattern_cost(pattern: str) -> str | None:
    """Why ``pattern`` would stall a permission check (None: it would not): tried against
    names of up to 255 characters made of its own literal characters with a character it does
    not expect at the end, the shape that makes a backtracking pattern explode, each within
    :data:`LOAD_TIMEOUT`."""
    compiled = compile_pattern(pattern)
    chars = sorted({c for c in pattern if c.isalnum() or c in "-_:@/ "})[:12] or ["a"]
    # the literal text a pattern starts with (``^team-`` ...), so an anchored one is reached
    prefix = _LITERAL_PREFIX.match(pattern).group(1)
    probes = [p + c * n + "\x00" for p in {"", prefix} for c in chars for n in (40, 200)]
    probes.append(("".join(chars) * 255)[:254] + "\x00")
    for probe in probes:
        try:
            compiled.search(probe, timeout=LOAD_TIMEOUT)
        except TimeoutError:
            return (
                f"it backtracks catastrophically: a {len(probe)}-character name took over "
                f"{LOAD_TIMEOUT * 1000:g} ms to match; rewrite it without nested or "
                "overlapping repetition (such as (a|aa)+ or (a+)+)"
            )
    return None


@dataclass(frozen=True, slots=True)
class Permission:
    """configure / write / read patterns of one user on one vhost (RabbitMQ's semantics)."""

    configure: str = FULL_PATTERN
    write: str = FULL_PATTERN
    read: str = FULL_PATTERN
    _compiled: dict[str, regex.Pattern[str]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        for kind in ("configure", "write", "read"):
            self._compiled[kind] = compile_pattern(getattr(self, kind))

    def allows(self, kind: PermissionKind, name: str) -> bool:
        """Whether the ``kind`` pattern matches (anywhere in) the resource ``name``; a match
        whose two tries each take longer than :data:`MATCH_TIMEOUT` refuses."""
        compiled = self._compiled[kind]
        for _try in range(2):
            try:
                return compiled.search(name, timeout=MATCH_TIMEOUT) is not None
            except TimeoutError:
                pass
        _timed_out(kind, self.pattern(kind), name)
        return False

    def pattern(self, kind: PermissionKind) -> str:
        return str(getattr(self, kind))

    def describe(self) -> str:
        return f"configure {self.configure!r} write {self.write!r} read {self.read!r}"


def _timed_out(kind: str, pattern: str, name: str) -> None:
    """Count a match that ran out of time; log it at most once a minute."""
    global timeouts_total, _last_timeout_log
    timeouts_total += 1
    now = time.monotonic()
    if now - _last_timeout_log >= 60.0:
        _last_timeout_log = now
        log.warning(
            "%s pattern %r took over %g ms twice on the name %r and refused it (%d such refusals "
            "so far); rewrite the pattern without nested or overlapping repetition",
            kind,
            pattern,
            MATCH_TIMEOUT * 1000,
            name[:64],
            timeouts_total,
        )


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
