"""Report fronts' rules (core/report_fronts.py) and what agents read of them
(protocol/gangstate.py): which fronts the leader names, the Lease's link annotations, the
endpoint's fronts as agents parse them and how agents spread over them."""

from __future__ import annotations

import collections

import pytest

from jobset_inplace import names
from jobset_inplace.core.report_fronts import (
    FRONT_TTL_S,
    Link,
    link_annotations,
    link_of,
    live_fronts,
)
from jobset_inplace.protocol.gangstate import FRONTS_MAX, Endpoint, Front, parse_endpoint

PIN = "ab" * 32


def front(i: int) -> Front:
    return Front(f"https://10.0.0.{i}:9444/v1/reports", PIN)


def test_the_fronts_heard_from_lately_are_named_sorted_and_few() -> None:
    heard = {front(i): 100.0 - i for i in range(9, 0, -1)}  # front 9 heard last at 91
    assert live_fronts(heard, 100.0) == tuple(front(i) for i in range(1, FRONTS_MAX + 1))
    now = 92.0 + FRONT_TTL_S + 0.5  # fronts 9 (heard at 91) and 8 (92) silent too long
    assert live_fronts(heard, now) == tuple(front(i) for i in range(1, 8))
    assert live_fronts({}, 0.0) == ()


@pytest.mark.parametrize(
    "link", [Link("10.0.0.5", 9445, PIN), Link("fd00::5", 1, PIN), Link("leader.local", 65535, PIN)]
)
def test_the_leases_annotations_name_the_link(link: Link) -> None:
    annotations = link_annotations(link)
    assert set(annotations) == {names.LEASE_REPORT_LINK, names.LEASE_REPORT_LINK_PIN}
    assert link_of(annotations) == link


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5:9445/v1/batches",
        "https://10.0.0.5/v1/batches",
        "https://10.0.0.5:0/v1/batches",
        "https://10.0.0.5:99999/v1/batches",
        "https://10.0.0.5:94x5/v1/batches",
        "https://:9445/v1/batches",
        "https://10.0.0.5:9445/v1/reports",
        "https://10.0.0.5:9445",
    ],
)
def test_an_unusable_link_is_none(url: str) -> None:
    assert link_of({names.LEASE_REPORT_LINK: url, names.LEASE_REPORT_LINK_PIN: PIN}) is None


def test_a_lease_without_a_usable_link_names_none() -> None:
    good = link_annotations(Link("10.0.0.5", 9445, PIN))
    assert link_of(None) is None
    assert link_of({}) is None
    assert link_of({**good, names.LEASE_REPORT_LINK_PIN: "AB" * 32}) is None
    assert link_of({names.LEASE_REPORT_LINK: good[names.LEASE_REPORT_LINK]}) is None


def test_agents_read_the_usable_fronts_at_most_a_few() -> None:
    listed = [
        {"url": front(1).url, "certSHA256": PIN},
        {"url": "http://10.0.0.2:9444/v1/reports", "certSHA256": PIN},  # not https
        {"url": front(3).url},  # no pin
        "https://10.0.0.4:9444/v1/reports",
        *({"url": front(i).url, "certSHA256": PIN} for i in range(5, 5 + FRONTS_MAX)),
    ]
    endpoint = parse_endpoint(
        {
            "url": "https://10.0.0.9:9444/v1/reports",
            "certSHA256": PIN,
            "leader": "l",
            "fronts": listed,
        }
    )
    assert endpoint is not None
    assert endpoint.fronts == (front(1), *(front(i) for i in range(5, 5 + FRONTS_MAX - 4)))
    no_list = parse_endpoint({"url": front(9).url, "certSHA256": PIN, "fronts": {"url": "x"}})
    assert no_list is not None
    assert no_list.fronts == ()


def test_agents_spread_over_the_fronts_each_to_the_same_one() -> None:
    endpoint = Endpoint(
        "https://10.0.0.9:9444/v1/reports", PIN, "l", (front(1), front(2), front(3))
    )
    uids = [f"3f2a-{i:05d}" for i in range(3000)]
    chosen = [endpoint.front_for(uid) for uid in uids]
    assert chosen == [endpoint.front_for(uid) for uid in uids], "the same front each time"
    counts = collections.Counter(c.url for c in chosen if c is not None)
    assert sorted(counts) == sorted(f.url for f in endpoint.fronts)
    assert min(counts.values()) > 3000 / 3 * 0.9, counts
    one = chosen[0]
    assert one is not None
    assert (one.leader, one.fronts) == ("l", ()), "a front of this leader"
    assert Endpoint(endpoint.url, PIN, "l").front_for(uids[0]) is None
    assert one.same_leader(endpoint) is False
    assert Endpoint(endpoint.url, PIN, "l").same_leader(endpoint)
