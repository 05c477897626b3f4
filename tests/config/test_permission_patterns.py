"""Permission patterns cannot stall the broker: a catastrophic pattern is refused at load with
its file and line, and a match is bounded in time whatever pattern got through (it refuses)."""

from __future__ import annotations

import pytest
from configutil import assert_located, fails

from plugbroker.config import parse_config
from plugbroker.config import users as users_mod
from plugbroker.config.users import Permission, check_pattern_cost

PATHOLOGICAL = "^(a|aa)+$"
#: the name that made ``^(a|aa)+$`` block an unbounded engine for 26 s
HOSTILE = "a" * 40 + "b"


def config(pattern: str) -> str:
    return (
        "<broker>\n<users>\n<user name='bob' password='pw'>\n"
        f"<permission vhost='/' configure='^bob-' write='^bob-' read='{pattern}'/>\n"
        "</user>\n</users>\n<virtualhost name='/'/>\n</broker>\n"
    )


def test_a_catastrophic_pattern_is_refused_at_load_with_its_line() -> None:
    err = fails(config(PATHOLOGICAL))
    assert_located(err, 4, "permission", "attribute read", PATHOLOGICAL, "backtracks")


@pytest.mark.parametrize("pattern", ["(a+)+$", "^(x|xx)+y$", "^team-(q|qq)+$"])
def test_other_nested_repetitions_are_refused_too(pattern: str) -> None:
    assert check_pattern_cost(pattern) is not None


@pytest.mark.parametrize(
    "pattern",
    ["", ".*", "^bob-", "^(bob-.*|amq\\.default)$", "^(amq\\.gen.*|amq\\.default)$", "^$"],
)
def test_ordinary_patterns_load(pattern: str) -> None:
    assert check_pattern_cost(pattern) is None
    cfg = parse_config(config(pattern), "ok.xml")
    assert cfg.users["bob"].permission("/") is not None


def test_a_match_that_runs_out_of_time_refuses_instead_of_stalling() -> None:
    perm = Permission(configure=PATHOLOGICAL, write="^bob-", read=PATHOLOGICAL)
    before = users_mod.timeouts_total
    assert not perm.allows("configure", HOSTILE)  # refused: the match ran out of time
    assert users_mod.timeouts_total == before + 1
    # what matches quickly is answered as always
    assert perm.allows("read", "a" * 41)
    assert perm.allows("write", "bob-q") and not perm.allows("write", "alice-q")
    assert users_mod.timeouts_total == before + 1
