"""The demo JobSet's persistent tier: one root per member (its job index) by default; one
root for the gang with ``shared_root`` (a replicated gang: the soak's ``--keep-step``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from bench import soak
from jobset_inplace import names
from jobset_inplace.core import goodput
from jobset_inplace.core.model import Mark
from jobset_inplace.core.transform import AgentSettings, transform
from jobset_inplace.times import parse_time
from testbed.controller import holder_index
from testbed.demo import GANG_MOUNT, PERSISTENT_MOUNT, demo_jobset, parse_timed_log
from testbed.demo_trainer import parse_truth


def _trainer(js: dict[str, Any]) -> dict[str, Any]:
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (trainer,) = [c for c in pod["containers"] if c["name"] == "trainer"]
    return dict(trainer)


def _persistent_mount(trainer: dict[str, Any]) -> dict[str, Any]:
    (mount,) = [m for m in trainer["volumeMounts"] if m["mountPath"] == PERSISTENT_MOUNT]
    return dict(mount)


def test_each_member_has_its_own_persistent_root_by_default() -> None:
    trainer = _trainer(demo_jobset("g", 2, persistent=Path("/tmp/x")))
    assert _persistent_mount(trainer)["subPathExpr"] == "$(JOB_INDEX)"
    assert "JOB_INDEX" in {e["name"] for e in trainer["env"]}


def test_a_replicated_gang_shares_one_persistent_root() -> None:
    trainer = _trainer(demo_jobset("g", 2, persistent=Path("/tmp/x"), shared_root=True))
    assert "subPathExpr" not in _persistent_mount(trainer)
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["JSI_CHECKPOINT_PERSISTENT_DIR"] == PERSISTENT_MOUNT
    assert "JOB_INDEX" in env, "a member's own files in the shared root (its truth log)"


def test_the_soak_keeps_steps_only_when_asked() -> None:
    assert soak.parse_args([]).keep_step is False
    assert soak.parse_args(["--keep-step"]).keep_step is True


def test_the_soak_counts_the_trainers_own_account_beside_the_controllers() -> None:
    """Two members, 1 s steps from t=100; member 0 crashes at 104.5 (its own line), member
    1's last step before it ends at 104; the gang resumes both at 2 in epoch 2 (t=110) and
    trains to the end (t=115). Window 100..115."""
    lines = {
        "0": ["resume 1 0", *(f"step 1 {s} {99 + s} {100 + s}" for s in range(1, 5))],
        "1": ["resume 1 0", *(f"step 1 {s} {99 + s} {100 + s}" for s in range(1, 5))],
    }
    lines["0"].append("crash 1 104.5")
    for member in lines.values():
        member += ["resume 2 2", *(f"step 2 {s} {107 + s} {108 + s}" for s in range(3, 8))]
    truths = {m: parse_truth("\n".join(v)) for m, v in lines.items()}
    failure = soak.Failure("crash", 2, 4.0, "workers/0/0", 5.0, 2, 2, {}, wall=103.0)
    account = soak.trainers_account(truths, [failure], since=100.0, end=115.0)
    # kept: steps 1-2 of epoch 1 and 3-7 of epoch 2 (7 s); wasted: 4.5 s of epoch 1 less 2 s
    each = {"goodput": round(7 / 15, 4), "wasted": round(2.5 / 15, 4)}
    assert account == {"members": {"0": each, "1": each}, "steps_lost": [2]}
    # without the crash line, the epoch ends when the soak injected the failure
    truths["0"] = parse_truth("\n".join(v for v in lines["0"] if not v.startswith("crash")))
    ended = soak.trainers_account(truths, [failure], since=100.0, end=115.0)
    assert ended["members"]["0"]["wasted"] == round((3.0 - 2.0) / 15, 4)


def test_the_soak_compares_each_failed_epochs_productive_time_by_kind() -> None:
    """The controller's productive seconds of an epoch (between its barrier marks around the
    failure) against each member's kept steps of it: epoch 1 kept 2 s by both members; the
    controller counted 2.3 s (0.3 s apart each, 2 points of 15 s) for the crash; a failure
    without a mark after it (not recovered) is not counted."""
    lines = {
        m: ["resume 1 0", *(f"step 1 {s} {99 + s} {100 + s}" for s in range(1, 5)), "resume 2 2"]
        for m in ("0", "1")
    }
    truths = {m: parse_truth("\n".join(v)) for m, v in lines.items()}
    marks = [Mark(100.0, 0.0, 0.0), Mark(110.0, 2.3, 10.0)]
    crash = soak.Failure("crash", 2, 4.0, "workers/0/0", 5.0, 2, 2, {}, wall=104.5)
    later = soak.Failure("hang", 3, 14.0, "workers/1/0", None, None, None, {}, wall=114.0)
    apart = soak.productive_apart_by_kind(truths, [crash, later], marks, 15.0)
    assert apart == {"crash": {"0": 2.0, "1": 2.0}}


def test_the_soak_compares_each_failed_epochs_wasted_progress_by_kind() -> None:
    """The controller's wasted progress of an epoch (its buckets summed at the failure's
    barrier less those at the barrier before) against each member's own of that epoch: epoch 1
    began at 100 and member 0 crashed at 104.5, steps 1-2 kept, so 2.5 s wasted by both
    members' steps (member 1's step 4 ended at 104: before the crash); the controller counted
    2.8 s (0.3 s apart, 2 points of 15 s). Epoch 2's, ended by a hang at 112.5 (the soak's
    injection) with 4 s of the gang's kept steps (3-6) and 1.5 s wasted, the controller's 1.5 s
    is its sum 4.3 less 2.8. A failure whose barrier recorded no buckets is not counted."""
    lines = {
        m: [
            "resume 1 0",
            *(f"step 1 {s} {99 + s} {100 + s}" for s in range(1, 5)),
            "resume 2 2",
            *(f"step 2 {s} {104 + s} {105 + s}" for s in range(3, 8)),
            "resume 3 6",
        ]
        for m in ("0", "1")
    }
    lines["0"].append("crash 1 104.5")
    truths = {m: parse_truth("\n".join(v)) for m, v in lines.items()}
    wasted = goodput.Bucket.WASTED_PROGRESS.value
    crash = soak.Failure(
        "crash", 2, 4.0, "workers/0/0", 5.0, 2, 2, {}, wall=104.5, badput_s={wasted: 2.8}
    )
    hang = soak.Failure(
        "hang", 3, 12.0, "workers/1/0", 5.0, 1, 6, {}, wall=112.5, badput_s={wasted: 4.3}
    )
    unrecorded = soak.Failure("drain", 4, 14.0, "workers/1/0", None, None, None, {}, wall=114.0)
    apart = soak.wasted_apart_by_kind(truths, [crash, hang, unrecorded], 15.0)
    assert apart == {"crash": {"0": 2.0, "1": 2.0}, "hang": {"0": 0.0, "1": 0.0}}


def test_a_finished_soak_is_recounted_from_the_truth_logs_it_left(tmp_path: Path) -> None:
    shared = tmp_path / "soak-shared"
    shared.mkdir()
    for m in ("0", "1"):
        steps = (f"step 1 {s} {99 + s} {100 + s}" for s in range(1, 5))
        (shared / f"truth-{m}.log").write_text("\n".join(["resume 1 0", *steps, "resume 2 2"]))
    crash = soak.Failure("crash", 2, 4.0, "workers/0/0", 5.0, 2, 2, {}, wall=104.5)
    marks = [
        {"at": "2026-12-03T00:00:00.000Z", "productiveSeconds": 0, "measuredSeconds": 0},
        {"at": "2026-12-03T00:00:10.000Z", "productiveSeconds": 2.3, "measuredSeconds": 10},
    ]
    t0 = parse_time("2026-12-03T00:00:00.000Z")
    assert t0 is not None
    crash.wall = t0 + 4.5
    doc = {
        "failures": [asdict(crash)],
        "goodput_status": {"marks": marks},
        "result": {"measured_s": 15.0, "trainers": {"members": {"0": {}, "1": {}}}},
    }
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(doc))
    soak.recount(path, shared)
    again = json.loads(path.read_text())
    apart = again["result"]["trainers"]["productive_points_apart_by_kind"]
    assert apart == {"crash": {"0": 2.0, "1": 2.0}}
    (shared / "truth-1.log").unlink()
    with pytest.raises(SystemExit, match="not of this soak's members"):
        soak.recount(path, shared)


def test_every_member_shares_the_gang_directory_whatever_the_tiers_layout() -> None:
    """The soak's lockstep files live there: with a root per member (the default) as with one
    for the gang, every member mounts the same host directory."""
    for shared_root in (False, True):
        js = demo_jobset("g", 2, persistent=Path("/tmp/x"), shared_root=shared_root)
        trainer = _trainer(js)
        (mount,) = [m for m in trainer["volumeMounts"] if m["mountPath"] == GANG_MOUNT]
        assert "subPathExpr" not in mount
        assert "subPath" not in mount
        pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["hostPath"]["path"] == "/tmp/x/gang"


def test_a_gang_with_spares_names_its_members_by_slot_and_spreads_its_pods() -> None:
    """The webhook refuses a trainer env read from the pod's position with spares (a spare's
    is not its member's): the demo JobSet with spares sets none, passes the transform, and
    its pods prefer nodes of their own (a drained node's pod may still share one)."""
    js = demo_jobset("g", 2, persistent=Path("/tmp/x"), shared_root=True, spares=1)
    assert js["metadata"]["annotations"][names.HOT_SPARES] == "1"
    assert "JOB_INDEX" not in {e["name"] for e in _trainer(js)["env"]}
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]
    assert list(anti) == ["preferredDuringSchedulingIgnoredDuringExecution"]
    out = transform(js, AgentSettings(image="example.test/agent:1"))
    assert out["spec"]["replicatedJobs"][0]["replicas"] == 3, "the spare is a pod of the gang"
    without = demo_jobset("g", 2, persistent=Path("/tmp/x"), shared_root=True)
    assert (
        "affinity"
        not in without["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    )
    with pytest.raises(ValueError, match="shared_root"):
        demo_jobset("g", 2, persistent=Path("/tmp/x"), spares=1)


def test_a_gang_together_has_every_pod_on_the_node_of_its_first() -> None:
    """Where the nodes share no host directory (kind), the gang's hostPath directories (its
    lockstep, its persistent tier) are one only on one node."""
    js = demo_jobset("g", 2, persistent=Path("/tmp/x"), together=True)
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {names.JOBSET_NAME_LABEL: "g"}
    with pytest.raises(ValueError, match="not both"):
        demo_jobset("g", 2, persistent=Path("/tmp/x"), shared_root=True, spares=1, together=True)


def test_the_soak_takes_spares_up_to_the_gang() -> None:
    assert soak.parse_args([]).spares == 0
    assert soak.parse_args(["--spares", "2"]).spares == 2
    for bad in ("-1", "3"):
        with pytest.raises(SystemExit):
            soak.parse_args(["--spares", bad])


def test_a_slot_is_held_by_its_own_pod_until_a_spare_takes_it() -> None:
    assert holder_index({}, "workers", 1) == "1"
    swapped = {"workers/1/0": "workers/2/0", "workers/2/0": "workers/1/0"}
    assert holder_index(swapped, "workers", 1) == "2"
    assert holder_index(swapped, "workers", 0) == "0"


def test_the_soak_counts_the_recoveries_that_moved_a_member_to_a_spare() -> None:
    def failure(kind: str, slots: dict[str, str], recovered: bool = True) -> soak.Failure:
        return soak.Failure(kind, 2, 0.0, "m", 1.0 if recovered else None, 0, 0, {}, slots=slots)

    moved = {"workers/1/0": "workers/2/0"}
    back = {"workers/1/0": "workers/2/0", "workers/0/0": "workers/1/0"}
    failures = [
        failure("crash", {}),
        failure("silence", moved),
        failure("hang", moved),
        failure("silence", back),
        failure("drain", {}, recovered=False),
    ]
    assert soak.slot_moves(failures) == {"silence": 2}
    assert soak.slot_moves([failure("crash", {})]) == {}


def test_the_soak_says_what_each_kind_of_failure_cost_by_bucket() -> None:
    """Each failure's buckets at its barrier less those at the one before; the gang's first
    start is none's; a failure whose predecessor carries no buckets is not counted."""

    def failure(kind: str, epoch: int, **badput: float) -> soak.Failure:
        return soak.Failure(kind, epoch, 0.0, "m", 1.0, 0, 0, {}, badput_s=badput)

    failures = [
        failure("crash", 2, scheduling=1.0, detection=0.1, recovery=0.5, wastedProgress=0.4),
        failure("silence", 3, scheduling=1.0, detection=15.1, recovery=9.5, wastedProgress=1.4),
        failure("crash", 4, scheduling=1.0, detection=15.2, recovery=10.0, wastedProgress=1.9),
        soak.Failure("hang", 5, 0.0, "m", 1.0, 0, 0, {}),  # recorded before the buckets were
        failure("crash", 6, detection=99.0),
    ]
    assert soak.badput_by_kind(failures) == {
        "crash": {
            "failures": 2,
            "detection": 0.2,
            "recovery": 1.0,
            "restore": 0.0,
            "wastedProgress": 0.9,
        },
        "silence": {
            "failures": 1,
            "detection": 15.0,
            "recovery": 9.0,
            "restore": 0.0,
            "wastedProgress": 1.0,
        },
    }


def test_a_soaks_goodput_interval_resamples_each_kinds_failures_within_the_kind() -> None:
    def failure(kind: str, epoch: int, detection: float) -> soak.Failure:
        return soak.Failure(kind, epoch, 0.0, "m", 1.0, 0, 0, {}, badput_s={"detection": detection})

    # own badput: crashes 1 and 3 s, silences 10 and 30 s (cumulative at each barrier)
    failures = [
        failure("crash", 2, 1.0),
        failure("silence", 3, 11.0),
        failure("crash", 4, 14.0),
        failure("silence", 5, 44.0),
    ]
    low, high = soak.goodput_interval(failures, 0.9, 1000.0) or (0.0, 0.0)
    # the totals a resample can reach: crashes 2-6 s, silences 20-60 s around the 44 s seen
    assert 0.9 - (66 - 44) / 1000 <= low < 0.9 < high <= 0.9 + (44 - 22) / 1000
    assert soak.goodput_interval(failures[:3], 0.9, 1000.0) is None  # one silence
    assert (
        soak.goodput_interval([soak.Failure("hang", 2, 0.0, "m", 1.0, 0, 0, {})], 0.9, 1.0) is None
    )


def test_a_timestamped_log_line_ends_at_a_newline_only() -> None:
    """A progress bar's carriage returns (tqdm's, the Hugging Face Trainer's) stay inside its
    line: splitting there too read the rest as a line with no timestamp."""
    out = (
        "2026-12-04T22:03:12.236472078Z  3%|1/30\r  7%|2/30\r[rank 0] step 2 loss 1.0\n"
        "2026-12-04T22:03:13.5Z [rank 0] step 20: checkpoint saved\n"
    )
    [(t1, bar), (t2, saved)] = parse_timed_log(out)
    assert bar.endswith("[rank 0] step 2 loss 1.0")
    assert "\r" in bar
    assert saved == "[rank 0] step 20: checkpoint saved"
    assert t2 - t1 == pytest.approx(1.263527922)
    assert parse_timed_log("") == []
    with pytest.raises(ValueError, match="not a timestamped log line"):
        parse_timed_log("no stamp here\n")


def test_the_soak_gives_each_failure_the_spare_events_until_the_next_one() -> None:
    first = soak.Failure("drain", 2, 10.0, "m", 1.0, 0, 0, {})
    second = soak.Failure("silence", 3, 190.0, "m", 5.0, 0, 0, {})
    events = [
        (200.0, "SpareSwapped", "b"),
        (5.0, "SpareMoved", "before any failure"),
        (12.0, "SpareSwapped", "a"),
        (150.0, "SpareMoved", "after the drain's end"),
    ]
    soak.assign_events([first, second], events)
    assert first.spare_events == [
        (12.0, "SpareSwapped", "a"),
        (150.0, "SpareMoved", "after the drain's end"),
    ]
    assert second.spare_events == [(200.0, "SpareSwapped", "b")]
