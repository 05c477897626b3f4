"""Users: RabbitMQ's password hashes, permissions with its regex semantics, tags, loopback, and
every bad <user> refused with file and line."""

from __future__ import annotations

import base64
import hashlib
import logging

import pytest
from configutil import assert_located, fails

from plugbroker.config import parse_config
from plugbroker.config.users import (
    Permission,
    decode_password_hash,
    hash_password,
    is_loopback,
    warn_plain_passwords,
)

# RabbitMQ's documented example (docs "Credentials and Passwords", hashing algorithm): salt
# 0x908DC60A, password "test12", SHA-256.
RABBIT_VECTOR = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"


def test_hash_matches_rabbitmqs_documented_vector() -> None:
    assert hash_password("test12", salt=bytes.fromhex("908DC60A")) == RABBIT_VECTOR


def test_hash_is_salt_then_digest_of_salt_and_password() -> None:
    salt = b"\x01\x02\x03\x04"
    for algorithm, fn in (("sha256", hashlib.sha256), ("sha512", hashlib.sha512)):
        raw = base64.b64decode(hash_password("pässword", algorithm, salt))
        assert raw == salt + fn(salt + "pässword".encode()).digest()
    # a random salt each time
    assert hash_password("x") != hash_password("x")


def test_user_checks_a_hashed_and_a_plain_password() -> None:
    h512 = hash_password("s3cret", "sha512")
    cfg = parse_config(
        "<broker><users>"
        f'<user name="rabbit" passwordHash="{RABBIT_VECTOR}"/>'
        f'<user name="long" passwordHash="{h512}" hashingAlgorithm="sha512"/>'
        '<user name="plain" password="pw"/>'
        "</users></broker>"
    )
    rabbit, long_, plain = cfg.users["rabbit"], cfg.users["long"], cfg.users["plain"]
    assert rabbit.check_password("test12") and not rabbit.check_password("test13")
    assert long_.check_password("s3cret") and not long_.check_password("")
    assert plain.check_password("pw") and not plain.check_password("pw ")
    assert plain.password_hash is None and rabbit.password is None


def test_permissions_tags_loopback_and_the_vhosts_shorthand() -> None:
    cfg = parse_config(
        "<broker><users>\n"
        '<user name="alice" password="a" tags="administrator monitoring" vhosts="/">\n'
        '  <permission vhost="other" configure="^alice-" write="" read="^(alice|shared)-.*$"/>\n'
        "</user>\n"
        '<user name="bob" password="b" loopbackOnly="true"/>\n'
        '<user name="guest" password="guest"/>\n'
        '<user name="guest2" password="guest"/>\n'
        "</users>"
        '<virtualhost name="/"/><virtualhost name="other"/></broker>'
    )
    alice = cfg.users["alice"]
    assert alice.tags == {"administrator", "monitoring"} and not alice.loopback_only
    assert alice.vhosts == ("/", "other")
    full, other = alice.permission("/"), alice.permission("other")
    assert full == Permission(".*", ".*", ".*")
    assert other is not None and (other.configure, other.write, other.read) == (
        "^alice-",
        "",
        "^(alice|shared)-.*$",
    )
    assert other.allows("configure", "alice-q") and not other.allows("configure", "bob-alice-q")
    # "" is RabbitMQ's "^$": no resource name (the default exchange is checked as amq.default)
    assert not other.allows("write", "amq.default") and not other.allows("write", "anything")
    assert other.allows("read", "shared-x") and not other.allows("read", "x-shared-x")
    assert alice.permission("nope") is None and not alice.can_access("nope")
    # bob: no vhosts attribute and no <permission>: "/" in full, as before
    assert cfg.users["bob"].vhosts == ("/",) and cfg.users["bob"].loopback_only
    # guest is loopback-only unless the file says otherwise (RabbitMQ's loopback_users)
    assert cfg.users["guest"].loopback_only and not cfg.users["guest2"].loopback_only
    assert "loopback-only" in cfg.describe() and "'^alice-'" in cfg.describe()


def test_patterns_are_searched_not_matched_whole() -> None:
    """RabbitMQ runs re:run on the name: a pattern matches anywhere unless anchored."""
    p = Permission(configure="gen", write="^x$", read=".*")
    assert p.allows("configure", "amq.gen-abc") and p.allows("configure", "gen")
    assert not p.allows("write", "xx") and p.allows("write", "x")
    assert p.allows("read", "") and p.allows("read", "amq.default")


def test_is_loopback() -> None:
    for host in ("127.0.0.1", "127.9.8.7", "::1", "::ffff:127.0.0.1", "[::1]"):
        assert is_loopback(host), host
    for host in ("10.0.0.1", "192.168.1.2", "::ffff:10.0.0.1", "fe80::1", "", "localhost"):
        assert not is_loopback(host), host


def test_plain_password_warned_once_per_user(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="plugbroker.config"):
        warn_plain_passwords([("warn-me", True), ("hashed", False)], "x.xml")
        warn_plain_passwords([("warn-me", True)], "x.xml")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'warn-me'" in lines[0] and "passwordHash" in lines[0]


def test_decode_password_hash_errors() -> None:
    with pytest.raises(ValueError, match="not base64"):
        decode_password_hash("***")
    with pytest.raises(ValueError, match="36"):
        decode_password_hash(hash_password("x", "sha512"), "sha256")


# ------------------------------------------------------------------------------- bad <user>s


def test_unknown_tag_is_refused_with_file_and_line() -> None:
    err = fails(
        '<broker><users>\n<user name="a" password="b" tags="administrater"/></users></broker>'
    )
    assert_located(err, 2, "user", "unknown tag 'administrater'", "administrator")


def test_bad_regex_is_refused_with_file_and_line() -> None:
    err = fails(
        '<broker><users>\n<user name="a" password="b">\n'
        '<permission vhost="/" configure=".*" write="(unclosed" read=".*"/>'
        "</user></users></broker>"
    )
    assert_located(err, 3, "permission", "attribute write", "'(unclosed'", "regular expression")


def test_bad_hash_is_refused_with_file_and_line() -> None:
    err = fails('<broker><users>\n<user name="a" passwordHash="abc!"/></users></broker>')
    assert_located(err, 2, "user", "passwordHash", "not base64")
    short = base64.b64encode(b"1234" + b"x" * 10).decode()
    err = fails(f'<broker><users>\n<user name="a" passwordHash="{short}"/></users></broker>')
    assert_located(err, 2, "user", "passwordHash", "decodes to 14 bytes")
    # a sha256 hash given as sha512
    err = fails(
        f'<broker><users>\n<user name="a" passwordHash="{RABBIT_VECTOR}" '
        'hashingAlgorithm="sha512"/></users></broker>'
    )
    assert_located(err, 2, "user", "a sha512 hash is 68")


def test_password_and_hash_are_exclusive_and_one_is_needed() -> None:
    both = f'<user name="a" password="b" passwordHash="{RABBIT_VECTOR}"/>'
    for user in (both, '<user name="a"/>'):
        err = fails(f"<broker><users>\n{user}</users></broker>")
        assert_located(err, 2, "user", "exactly one of password= and passwordHash=")


def test_permission_on_undeclared_vhost_and_twice_on_one_vhost() -> None:
    err = fails(
        '<broker><users>\n<user name="a" password="b">\n'
        '<permission vhost="nope" configure="" write="" read=""/>'
        "</user></users></broker>"
    )
    assert_located(err, 3, "permission", "virtualhost 'nope', which is not declared")
    err = fails(
        '<broker><users>\n<user name="a" password="b" vhosts="/">\n'
        '<permission vhost="/" configure="" write="" read=""/>'
        "</user></users></broker>"
    )
    assert_located(err, 3, "permission", "two permissions for virtualhost '/'", "line 2")


def test_a_permission_needs_all_three_patterns() -> None:
    err = fails(
        '<broker><users>\n<user name="a" password="b">\n'
        '<permission vhost="/" configure=".*" read=".*"/>'
        "</user></users></broker>"
    )
    assert err.line == 3 and "write" in str(err)
