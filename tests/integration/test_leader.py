"""Leader election against a real kube-apiserver: one leader at a time, hand-over on release,
take-over of a silent leader after the lease duration (not before), and a leader that cannot
renew stops (short timings: the rules, not the defaults, are under test)."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from jobset_inplace.core.leader_rules import ElectionTiming
from jobset_inplace.runtime import leader_election
from jobset_inplace.runtime.leader_election import Election, ElectionError, LeaderElector
from testbed.kube import Clients
from testbed.processes import wait_until

pytestmark = pytest.mark.integration

FAST = ElectionTiming(lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.5)
SLOW = ElectionTiming(lease_duration_s=30, renew_deadline_s=2, retry_period_s=0.5)
LEASE = "test-leader"


class Lost:
    """on_lost callback: records why and wakes the test."""

    def __init__(self) -> None:
        self.why: list[str] = []
        self.event = threading.Event()

    def __call__(self, why: str) -> None:
        self.why.append(why)
        self.event.set()


def candidate(
    kube: Clients, namespace: str, identity: str, timing: ElectionTiming = FAST
) -> LeaderElector:
    election = Election(namespace=namespace, identity=identity, timing=timing, lease=LEASE)
    return LeaderElector(client.CoordinationV1Api(kube.api), election)


def spec(kube: Clients, namespace: str) -> client.V1LeaseSpec:
    lease = kube.coordination.read_namespaced_lease(LEASE, namespace)
    return lease.spec


def test_one_leader_then_hand_over_on_release(kube: Clients, namespace: str) -> None:
    a, b = candidate(kube, namespace, "a"), candidate(kube, namespace, "b")
    assert a.try_once()
    assert not b.try_once()
    assert b.holder == "a"
    s = spec(kube, namespace)
    assert (s.holder_identity, s.lease_duration_seconds, s.lease_transitions) == ("a", 3, 0)
    assert a.try_once(), "the holder renews"
    a.release()
    assert b.try_once(), "a released Lease is taken at the next try"
    s = spec(kube, namespace)
    assert (s.holder_identity, s.lease_transitions) == ("b", 1)


def test_a_leader_releasing_after_its_grants_keeps_the_lease_unrenewed_until_then(
    kube: Clients, namespace: str
) -> None:
    """A stopping leader whose channel granted report leases releases only once they ended:
    meanwhile no candidate takes the Lease (its last renewal is fresh), and the holder
    renews it no more."""
    # a lease duration well past the wait: b can take the Lease only once it was released
    a, b = candidate(kube, namespace, "a", SLOW), candidate(kube, namespace, "b", SLOW)
    assert a.try_once()
    renewed = spec(kube, namespace).renew_time
    releasing = threading.Thread(target=a.release, kwargs={"after_s": 3.0})
    releasing.start()
    try:
        time.sleep(0.5)  # well inside the 3 s: released at once, b would take it now
        assert not b.try_once(), "the Lease is not released before its grants ended"
        s = spec(kube, namespace)
        assert (s.holder_identity, s.renew_time) == ("a", renewed), "held, not renewed"
    finally:
        releasing.join()
    assert not spec(kube, namespace).holder_identity, "released once its grants ended"
    assert b.try_once(), "then taken at the next try"


def test_a_silent_leader_is_replaced_after_the_lease_duration(
    kube: Clients, namespace: str
) -> None:
    a, b = candidate(kube, namespace, "a"), candidate(kube, namespace, "b")
    assert a.try_once()  # then a crashes: no renewal, no release
    start = time.monotonic()
    b.acquire()
    took = time.monotonic() - start
    print(f"\nsilent leader replaced after {took:.2f}s (lease duration {FAST.lease_duration_s}s)")
    assert took >= FAST.lease_duration_s, "never before the lease duration"
    assert spec(kube, namespace).holder_identity == "b"


def test_a_leader_whose_lease_is_taken_stops(kube: Clients, namespace: str) -> None:
    a = candidate(kube, namespace, "a")
    assert a.try_once()
    lost = Lost()
    a.keep(on_lost=lost)
    try:
        kube.coordination.patch_namespaced_lease(
            LEASE, namespace, {"spec": {"holderIdentity": "intruder"}}
        )
        assert lost.event.wait(FAST.retry_period_s * 4)
        assert lost.why == [f"Lease {namespace}/{LEASE} is now held by intruder"]
    finally:
        a.release()
    assert spec(kube, namespace).holder_identity == "intruder", "release leaves others' Lease"


def test_a_leader_that_cannot_renew_stops_at_the_renew_deadline(
    kube: Clients, namespace: str
) -> None:
    a = candidate(kube, namespace, "a")
    assert a.try_once()
    lost = Lost()

    def refuse(*_: object, **__: object) -> None:  # every write now fails (apiserver trouble)
        raise ApiException(status=500, reason="Internal Server Error")

    a.api.replace_namespaced_lease = refuse
    a.keep(on_lost=lost)
    try:
        assert lost.event.wait(FAST.renew_deadline_s + 2)
        assert a.renewed_at is not None
        late = time.monotonic() - a.renewed_at
        assert FAST.renew_deadline_s <= late < FAST.renew_deadline_s + 1, late
        assert lost.why == [f"no renewal of Lease {namespace}/{LEASE} for 2s"]
    finally:
        a.release()


def test_a_missing_namespace_is_named_and_waited_for(
    kube: Clients, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No crash loop: the candidate logs the fix and takes the Lease once it is applied."""
    monkeypatch.setattr(leader_election, "SETUP_RETRY_S", 0.2)
    ns = f"created-late-{uuid.uuid4().hex[:6]}"
    c = candidate(kube, ns, "a")
    with pytest.raises(ElectionError, match=f"namespace {ns} not found"):
        c.try_once()
    done = threading.Event()

    def acquire() -> None:
        c.acquire()
        done.set()

    t = threading.Thread(target=acquire, daemon=True)
    with caplog.at_level(logging.ERROR, logger="jobset_inplace.controller"):
        t.start()
        wait_until("the error logged", lambda: f"namespace {ns} not found" in caplog.text, 10)
        assert not done.is_set(), "no Lease without its namespace"
        kube.core.create_namespace({"metadata": {"name": ns}})
        try:
            assert done.wait(10), "the candidate takes the Lease once the namespace exists"
        finally:
            c.release()
            kube.core.delete_namespace(ns)


def test_missing_rights_are_named(kube: Clients, namespace: str) -> None:
    api = client.ApiClient(kube.api.configuration)
    api.set_default_header("Impersonate-User", "someone-without-rights")
    election = Election(namespace=namespace, identity="a", timing=FAST, lease=LEASE)
    c = LeaderElector(client.CoordinationV1Api(api), election)
    with pytest.raises(ElectionError, match=r"not allowed to read Lease .*: grant it"):
        c.try_once()


def test_the_holders_annotations_reach_the_candidates_and_go_with_it(
    kube: Clients, namespace: str
) -> None:
    """What a leader tells the other candidates on its Lease (a report front learns its link
    there): read by each candidate's next round, and gone once it released the Lease."""
    a, b = candidate(kube, namespace, "a"), candidate(kube, namespace, "b")
    assert a.try_once()
    a.annotations = {"example.dev/link": "one"}
    assert not b.try_once()
    assert b.seen_annotations == {}, "written at the holder's next renewal"
    assert a.try_once()
    assert not b.try_once()
    assert b.seen_annotations == {"example.dev/link": "one"}
    a.release()
    lease = kube.coordination.read_namespaced_lease(LEASE, namespace)
    assert not lease.metadata.annotations, "a released Lease names nothing of its last holder's"
    assert b.try_once()
    assert b.seen_annotations == {}
