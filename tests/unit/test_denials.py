"""Repeated refusals counted per kind and window, with a bound on the rows however many callers refuse."""

from __future__ import annotations

from taskmesh.api.denials import SUMMARY_ACTION, Denials, client_network
from taskmesh.security.audit import AuditEvent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refusal(addr: str, reason: str = "unknown_key", key_id: str | None = None) -> AuditEvent:
    return AuditEvent(
        "GET /api/v1/tasks",
        actor_id=key_id,
        outcome="denied",
        status=401,
        client_addr=addr,
        details={"refused": reason},
    )


def test_the_first_refusal_of_a_kind_is_written_and_the_next_ones_counted_until_the_window_ends() -> None:
    clock = Clock()
    denials = Denials(window=60, clock=clock)
    assert denials.admit(refusal("203.0.113.9"))
    assert [denials.admit(refusal("203.0.113.9", key_id=f"k{i}")) for i in range(5)] == [False] * 5
    assert denials.admit(refusal("203.0.113.9", "no_key"))  # another reason: another kind
    assert denials.admit(refusal("198.51.100.1"))  # another address: another kind
    assert denials.due() == []
    clock.now += 60
    [summary] = denials.due()
    assert (summary.action, summary.client_addr, summary.outcome, summary.status) == (
        SUMMARY_ACTION,
        "203.0.113.9",
        "denied",
        401,
    )
    assert summary.details["count"] == 5 and summary.details["key_ids"] == ["k0", "k1", "k2", "k3", "k4"]
    assert denials.admit(refusal("203.0.113.9"))  # a new window: written in full again


def test_past_kinds_most_new_kinds_are_only_counted_so_a_flood_from_many_addresses_writes_a_bounded_number() -> None:
    clock = Clock()
    denials = Denials(window=60, kinds_most=10, clock=clock)
    written = sum(denials.admit(refusal(f"10.0.{i // 250}.{i % 250}")) for i in range(10_000))
    clock.now += 60
    summaries = denials.due()
    assert written == 10
    [overflow] = summaries  # the ten kinds had no second refusal: no summary of their own
    assert (overflow.actor_type, overflow.client_addr, overflow.details["count"]) == ("system", None, 9_990)
    assert len(overflow.details["addresses"]) == 20


def test_summaries_that_could_not_be_written_wait_for_the_next_tick_within_a_bound() -> None:
    clock = Clock()
    denials = Denials(window=60, kinds_most=2, clock=clock)
    for addr in ("10.0.0.1", "10.0.0.2"):
        denials.admit(refusal(addr))
        denials.admit(refusal(addr))
    clock.now += 60
    due = denials.due()
    assert len(due) == 2
    denials.keep(due)
    denials.keep(due * 10)
    assert len(denials.due()) == 6  # 2 x kinds_most + 2


def test_an_ipv6_client_is_counted_by_its_64_network() -> None:
    assert client_network("2001:db8:1:2:aaaa::1") == client_network("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_network("::ffff:203.0.113.9") == "203.0.113.9"
    assert client_network("203.0.113.9") == "203.0.113.9"
    assert client_network(None) == "-"
