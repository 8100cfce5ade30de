"""A node's health verdict (core/detection.py): the shortcut for a Ready node with nothing but
its Lease to say (:func:`lease_state`, every member's node in every pass) gives the general
path's answer (:func:`signals_state`) for every Lease age, observation start, threshold and
instant, the edges (a renewal exactly a renew interval old, a threshold of 0) included."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jobset_inplace.core.detection import (
    LEASE_RENEW_INTERVAL_S,
    lease_state,
    node_state,
    signals_state,
)
from jobset_inplace.core.model import NodeView
from jobset_inplace.core.policy import Policy

NOW = 1_000_000.0
# offsets from now in seconds, the renew interval's edges among them
AGES = st.one_of(
    st.sampled_from([0.0, LEASE_RENEW_INTERVAL_S, LEASE_RENEW_INTERVAL_S + 30.0, 40.0]),
    st.floats(-5.0, 600.0, allow_nan=False),
)
AFTER = st.one_of(st.sampled_from([0.0, 30.0]), st.floats(0.0, 300.0, allow_nan=False))


@given(
    renewed_age=st.one_of(st.none(), AGES),
    observed_age=AGES,
    after=AFTER,
    later=st.one_of(st.sampled_from([0.0, 30.0, 40.0]), st.floats(0.0, 600.0)),
)
def test_a_lease_only_node_gets_the_general_verdict(
    renewed_age: float | None, observed_age: float, after: float, later: float
) -> None:
    node = NodeView("n", lease_renewed=None if renewed_age is None else NOW - renewed_age)
    policy = Policy(node_unhealthy_after_s=after)
    for now in (NOW, NOW + later):
        general = signals_state(node, policy, now, NOW - observed_age)
        assert lease_state(node, policy, now, NOW - observed_age) == general
        assert node_state(node, policy, now, NOW - observed_age) == general


def test_a_node_with_any_other_signal_takes_the_general_path() -> None:
    policy = Policy(node_unhealthy_after_s=30.0)
    renewed = NOW - 1.0  # a fresh Lease: only the other signal counts
    for node in (
        NodeView("n", ready="False", ready_since=NOW - 60, lease_renewed=renewed),
        NodeView(
            "n", lease_renewed=renewed, taints=(("node.kubernetes.io/unreachable", NOW - 60),)
        ),
    ):
        assert (
            node_state(node, policy, NOW, 0.0)
            == (True, None)
            == signals_state(node, policy, NOW, 0.0)
        )
        assert lease_state(node, policy, NOW, 0.0) == (
            False,
            renewed + LEASE_RENEW_INTERVAL_S + 30.0,
        )
