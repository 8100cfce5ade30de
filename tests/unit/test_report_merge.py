"""One member's reports, from its pod's annotations and over the report channel, in any order
and any mix, as the controller's cache merges them: what the planner sees for the member is
its newest valid report, and a later valid report of the current epoch always counts
(issue: a gang stalled after one member's malformed channel reports).

Valid: well formed and about no epoch beyond the gang's (an agent learns epochs only from the
GangState, so a report ahead of it is forged or corrupt). The channel refuses a report ahead of
the gang; one written on the pod ranks below every other until the gang reaches its epoch."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from jobset_inplace import names
from jobset_inplace.controller.cache import ClusterCache, pod_entry
from jobset_inplace.core.model import GangStatus, PodView
from jobset_inplace.protocol.report import AgentReport, decode_report

from .test_cache import NOW, cache_with_gang, owner

KEY = ("ns", "train")
MEMBER = 1  # the member whose reports are tried; member 0 is quiet


def member_pod(uid: str, annotations: dict[str, str], *, deleted: bool = False) -> object:
    labels = {
        names.JOBSET_NAME_LABEL: "train",
        names.REPLICATED_JOB_LABEL: "workers",
        names.JOB_INDEX_LABEL: str(MEMBER),
        names.COMPLETION_INDEX_LABEL: "0",
    }
    meta = {
        "name": f"p-{uid}",
        "namespace": "ns",
        "uid": uid,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [owner("Job", "batch/v1", f"job-{MEMBER}")],
    }
    return pod_entry({"metadata": meta, "spec": {"nodeName": "n"}, "status": {"phase": "Running"}})


# A report, relative to the gang's epoch E when it is made: (what, offset).
KINDS = (
    "epoch",  # epoch E+offset with steps (offset 0: the valid report of the current epoch)
    "exited",  # epoch E+offset and an exit seen in it
    "exit-alone",  # an exit in E+offset, no epoch (an older agent's fallback)
    "hung-ahead",  # epoch E and a hang in E+offset+1: ahead
    "steps-only",  # steps, no epoch
    "empty",  # nothing at all (valid: it says nothing)
    "malformed",  # the decoder refuses it
)


def values(kind: str, offset: int, epoch: int) -> dict[str, str]:
    e = max(0, epoch + offset)
    return {
        "epoch": {names.REPORT_EPOCH: str(e), names.REPORT_STEPS: "200,100"},
        "exited": {names.REPORT_EPOCH: str(e), names.REPORT_EXITED: str(e)},
        "exit-alone": {names.REPORT_EXITED: str(e)},
        "hung-ahead": {names.REPORT_EPOCH: str(epoch), names.REPORT_HUNG: str(epoch + 1 + offset)},
        "steps-only": {names.REPORT_STEPS: "100"},
        "empty": {},
        "malformed": {names.REPORT_EPOCH: f"{epoch}.0", names.REPORT_STEPS: "1,x"},
    }[kind]


def about(v: dict[str, str]) -> tuple[int, int, int | None]:
    """The spec, written out: (the epoch a well-formed report is about, the exit or hang it
    saw (-1: none), the epoch it names (None: none))."""
    named = int(v[names.REPORT_EPOCH]) if names.REPORT_EPOCH in v else None
    seen = max((int(v[k]) for k in (names.REPORT_EXITED, names.REPORT_HUNG) if k in v), default=-1)
    return max(-1 if named is None else named, seen), seen, named


def decoded(v: dict[str, str]) -> AgentReport:
    report, error = decode_report(v)
    assert report is not None, error
    return report


def well_formed(v: dict[str, str]) -> bool:
    return decode_report(v)[1] is None


@dataclass
class Model:
    """What the member has said, as the spec reads it."""

    epoch: int
    uid: str = "m1-0"
    on_pod: dict[str, str] = field(default_factory=dict)  # its pod's report annotations
    channel: dict[str, str] | None = None  # the channel report kept for its current pod

    def channel_takes(self, v: dict[str, str]) -> bool:
        return well_formed(v) and about(v)[0] <= self.epoch

    def kept(self) -> dict[str, str] | None:
        """The channel's report, unless it is ahead of the gang (its GangState made again)."""
        ahead = self.channel is not None and about(self.channel)[0] > self.epoch
        return None if ahead else self.channel

    def take(self, v: dict[str, str]) -> None:
        kept = self.kept()
        if kept is None or about(v)[:2] >= about(kept)[:2]:
            self.channel = v

    def counted(self) -> tuple[bool, bool]:
        """(whether the planner must count the member as reported in the current epoch,
        whether it must see an exit or hang in it), by the newest valid of its pod's report
        and the channel's, the channel's on a tie; a pod report that is malformed or ahead
        ranks below any."""
        pod = self.on_pod if well_formed(self.on_pod) else None
        if pod is not None and about(pod)[0] > self.epoch:
            pod = None
        channel = self.kept()
        rank = {"pod": about(pod)[:2] if pod is not None else (-2, -2)}
        rank["channel"] = about(channel)[:2] if channel is not None else (-3, -3)
        newest = channel if rank["channel"] >= rank["pod"] else pod
        if newest is None:
            return False, False
        named = about(newest)[2]
        if newest is pod and named is None and channel is not None:
            named = about(channel)[2]  # an exit alone on the pod adds to the channel's epoch
        return named == self.epoch, about(newest)[1] == self.epoch


OPS = st.one_of(
    st.tuples(st.sampled_from(["channel", "pod"]), st.sampled_from(KINDS), st.integers(-1, 3)),
    st.tuples(st.just("replace"), st.just(""), st.just(0)),
    st.tuples(st.just("advance"), st.just(""), st.just(0)),
    st.tuples(st.just("remade"), st.just(""), st.just(0)),
)


def view_of(c: ClusterCache, uid: str) -> PodView:
    snap = c.snapshot(c.gangs[KEY], NOW)
    assert snap is not None
    (view,) = [p for p in snap.pods if p.uid == uid]
    return view


def start(epoch: int) -> tuple[ClusterCache, Model]:
    c = cache_with_gang()
    c.gangs[KEY].status = GangStatus(epoch=epoch)
    m = Model(epoch)
    c.upsert_pod(member_pod(m.uid, {}))  # type: ignore[arg-type]
    return c, m


def apply(c: ClusterCache, m: Model, op: tuple[str, str, int], n: int) -> None:
    what, kind, offset = op
    gang = c.gangs[KEY]
    if what == "channel":
        v = values(kind, offset, m.epoch)
        fields, _ = decode_report(v)
        if fields is None:
            return  # the server refuses it before the cache (400)
        refused = c.set_report(KEY, m.uid, fields)
        assert (refused is None) == m.channel_takes(v), (v, refused)
        if refused is None:
            m.take(v)
    elif what == "pod":
        m.on_pod = values(kind, offset, m.epoch)
        c.upsert_pod(member_pod(m.uid, m.on_pod))  # type: ignore[arg-type]
    elif what == "replace":  # the pod deleted, its replacement made (its agent new)
        c.upsert_pod(member_pod(m.uid, m.on_pod), deleted=True)  # type: ignore[arg-type]
        m.uid, m.on_pod, m.channel = f"m1-{n + 1}", {}, None
        c.upsert_pod(member_pod(m.uid, {}))  # type: ignore[arg-type]
    elif what == "remade":  # the GangState deleted and made again: epoch 1 (reconciler)
        m.epoch = 1
        gang.status, gang.announced_epoch = GangStatus(epoch=1), 0
    else:  # a recovery: the controller writes the next epoch
        m.epoch += 1
        if n % 2:
            gang.announced_epoch = m.epoch  # begun to write; the status not back yet
        else:
            gang.status = GangStatus(epoch=m.epoch)


def seen(view: PodView, epoch: int) -> tuple[bool, bool]:
    """As the planner reads a member's view: reported in ``epoch``; failed in it."""
    return view.reported_epoch == epoch, epoch in (view.exited_in_epoch, view.hung_in_epoch)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 3), st.lists(OPS, max_size=12), st.sampled_from(["channel", "pod"]))
def test_the_member_is_seen_by_its_newest_valid_report_and_a_valid_one_always_counts(
    first: int, ops: list[tuple[str, str, int]], last: str
) -> None:
    c, m = start(first)
    for n, op in enumerate(ops):
        apply(c, m, op, n)
        assert seen(view_of(c, m.uid), m.epoch) == m.counted(), (n, op, m)
    # then the member's agent reports the current epoch, over the channel or on its pod: it
    # counts (or an exit or hang it reported in this epoch is seen: a recovery follows)
    apply(c, m, (last, "epoch", 0), len(ops))
    reported, failed = seen(view_of(c, m.uid), m.epoch)
    assert reported or failed


def test_a_report_ahead_of_the_gang_is_refused_and_hides_nothing() -> None:
    """The stall seen: a member's report of a later epoch (valid to the decoder) was kept as
    the newest and every later report of the current epoch, answered 200, was dropped."""
    c, m = start(1)
    ahead = decoded({names.REPORT_EPOCH: "2", names.REPORT_STEPS: "100"})
    refused = c.set_report(KEY, m.uid, ahead)
    assert refused is not None
    assert "epoch 2, beyond the gang's 1" in refused
    for v in ({names.REPORT_EPOCH: "1", names.REPORT_EXITED: "9"}, {names.REPORT_HUNG: "5"}):
        assert c.set_report(KEY, m.uid, decoded(v)) is not None, v
    current = decoded({names.REPORT_EPOCH: "1", names.REPORT_STEPS: "100"})
    assert c.set_report(KEY, m.uid, current) is None
    assert view_of(c, m.uid).reported_epoch == 1


def test_a_report_written_on_the_pod_ahead_of_the_gang_hides_no_channel_report() -> None:
    c, m = start(1)
    c.upsert_pod(member_pod(m.uid, {names.REPORT_EPOCH: "7"}))  # type: ignore[arg-type]
    current = decoded({names.REPORT_EPOCH: "1", names.REPORT_STEPS: "100"})
    assert c.set_report(KEY, m.uid, current) is None
    assert view_of(c, m.uid).reported_epoch == 1
    # once the gang is at epoch 7, the pod's report is the newest: the views are merged again
    c.gangs[KEY].status = GangStatus(epoch=7)
    assert view_of(c, m.uid).reported_epoch == 7


def test_an_epoch_being_written_is_not_ahead() -> None:
    """An agent may read epoch 2 from the API before the leader's write of it returns: its
    report is taken (the reconciler says which epoch it writes before it writes it)."""
    c, m = start(1)
    c.gangs[KEY].announced_epoch = 2
    fields = decoded({names.REPORT_EPOCH: "2", names.REPORT_STEPS: "100"})
    assert c.set_report(KEY, m.uid, fields) is None
    assert view_of(c, m.uid).reported_epoch == 2


def test_a_replacement_pod_starts_with_none_of_its_predecessors_reports() -> None:
    c, m = start(3)
    fields = decoded({names.REPORT_EPOCH: "3", names.REPORT_STEPS: "100"})
    assert c.set_report(KEY, m.uid, fields) is None
    c.upsert_pod(member_pod(m.uid, {}), deleted=True)  # type: ignore[arg-type]
    c.upsert_pod(member_pod("m1-new", {}))  # type: ignore[arg-type]
    assert view_of(c, "m1-new").reported_epoch is None
    assert c.set_report(KEY, m.uid, fields) is not None, "the dead pod's reports are refused"
    assert c.gangs[KEY].reports.keys() == set()
