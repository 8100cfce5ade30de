"""Hang detection's rule (agent/hang.py) and the progress record it reads (trainer/progress.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobset_inplace.agent.hang import HangRule, HangWatch, Hung
from jobset_inplace.trainer.progress import (
    Progress,
    ProgressReporter,
    ProgressSpan,
    clear_progress,
    decode_span,
    encode_span,
    progress_file,
    read_progress,
    span_of,
)


def watch(hang: float | None = 30, startup: float | None = 60, epoch: int = 2) -> HangWatch:
    w = HangWatch(HangRule(hang, startup))
    w.opened(epoch, 100.0)
    return w


def test_nothing_before_a_barrier_opened() -> None:
    w = HangWatch(HangRule(1, 1))
    assert w.observe(1e9, {}) is None


def test_startup_hang_counts_from_the_barrier_opening() -> None:
    w = watch()
    assert w.observe(159.9, {}) is None
    hung = w.observe(160, {})
    assert isinstance(hung, Hung)
    assert hung.epoch == 2
    assert "startup-timeout 60 s" in hung.reason


def test_a_first_step_ends_the_startup_clock() -> None:
    w = watch(hang=None)
    assert w.observe(150, {"trainer": Progress(0, 1.0)}) is None
    assert w.observe(10_000, {"trainer": Progress(0, 1.0)}) is None, "hang-timeout is off"


def test_a_trainer_parked_at_a_planned_stop_is_never_hung() -> None:
    """A planned stop: a trainer parks at the gang's step and waits there until every member
    parked and the gang moved on, however long that takes; its peer still training is not
    excused."""
    w = watch(startup=None)
    parked = {"a": Progress(7, 0.0, parked=True), "b": Progress(7, 0.0)}
    assert w.observe(1000, parked) is None
    hung = w.observe(1030, parked)
    assert hung is not None
    assert "trainer b has been at step 7" in hung.reason, "not the parked one"
    alone = watch(startup=None)
    assert alone.observe(1000, {"a": parked["a"]}) is None
    assert alone.observe(100_000, {"a": parked["a"]}) is None


def test_hang_counts_from_when_the_agent_saw_the_record_change() -> None:
    w = watch(startup=None)
    assert w.observe(1000, {}) is None, "startup-timeout is off"
    assert w.observe(1001, {"t": Progress(5, 0.0)}) is None
    assert w.observe(1030.9, {"t": Progress(5, 0.0)}) is None
    assert w.observe(1031, {"t": Progress(6, 0.0)}) is None  # advanced
    hung = w.observe(1061, {"t": Progress(6, 0.0)})
    assert hung is not None
    assert "trainer t has been at step 6 for 30.0 s" in hung.reason


def test_the_trainers_own_timestamps_are_not_trusted() -> None:
    w = watch(startup=None)
    assert w.observe(200, {"t": Progress(5, 1e12)}) is None  # a far-future "at"
    assert w.observe(230, {"t": Progress(5, 1e12)}) is not None


def test_a_rewritten_record_with_the_same_step_is_progress() -> None:
    """A new ``at`` is a new call of the trainer: it is alive (e.g. after resuming the step)."""
    w = watch(startup=None)
    w.observe(200, {"t": Progress(5, 1.0)})
    assert w.observe(229, {"t": Progress(5, 2.0)}) is None
    assert w.observe(258, {"t": Progress(5, 2.0)}) is None


def test_every_trainer_of_the_pod_is_watched() -> None:
    w = watch(startup=None)
    w.observe(200, {"a": Progress(1, 0.0), "b": Progress(1, 0.0)})
    w.observe(220, {"a": Progress(2, 0.0), "b": Progress(1, 0.0)})
    hung = w.observe(230, {"a": Progress(2, 0.0), "b": Progress(1, 0.0)})
    assert hung is not None
    assert "trainer b" in hung.reason


def test_reopening_forgets_the_records() -> None:
    w = watch(startup=None)
    w.observe(200, {"t": Progress(1, 0.0)})
    w.opened(3, 225.0)
    assert w.observe(240, {}) is None
    assert w.seen == {}


def test_rule_enabled() -> None:
    assert not HangRule().enabled
    assert HangRule(hang_timeout=10).enabled
    assert HangRule(startup_timeout=10).enabled


# --- the progress record ------------------------------------------------------------------


def test_reporter_writes_a_record_per_new_step(tmp_path: Path) -> None:
    report = ProgressReporter(tmp_path, "trainer")
    report(3)
    path = progress_file(tmp_path, "trainer")
    first = path.stat().st_mtime_ns
    doc = json.loads(path.read_text())
    assert doc["step"] == 3
    assert isinstance(doc["at"], float)
    path.write_text("{}")  # a same-step call must not rewrite: proven by the file staying
    report(3)
    assert path.read_text() == "{}"
    report(4)
    assert read_progress(tmp_path)["trainer"].step == 4
    assert path.stat().st_mtime_ns >= first
    assert [p.name for p in tmp_path.iterdir()] == ["progress-trainer.json"], "no temp file left"


def test_reporter_names_its_record_after_the_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JSI_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("JSI_CONTAINER_NAME", "worker")
    ProgressReporter()(1)
    assert set(read_progress(tmp_path)) == {"worker"}


def test_reporter_sums_the_busy_times(tmp_path: Path) -> None:
    report = ProgressReporter(tmp_path, "t")
    report(1)
    assert read_progress(tmp_path)["t"].busy is None, "not said: no busyS"
    report(2, busy_s=0.5)
    report(2, busy_s=0.25)  # a same-step call adds, for the next write
    report(3, busy_s=1)
    record = read_progress(tmp_path)["t"]
    assert record == Progress(3, record.at, 1.75, 1, record.first_at)
    for bad in [-1.0, float("nan"), True, "1"]:
        with pytest.raises(ValueError, match="busy_s must be seconds"):
            report(4, busy_s=bad)  # type: ignore[arg-type]
    (tmp_path / "progress-x.json").write_text(json.dumps({"step": 1, "at": 1, "busyS": "a"}))
    assert read_progress(tmp_path)["x"] == Progress(1, 1.0, None), "bad busyS: still progress"


@pytest.mark.parametrize("step", [-1, 2**63, True, 1.5, "3"])
def test_reporter_refuses_a_bad_step(tmp_path: Path, step: object) -> None:
    with pytest.raises(ValueError, match="step must be an integer"):
        ProgressReporter(tmp_path, "t")(step)  # type: ignore[arg-type]


def test_read_progress_leaves_out_what_is_not_a_record(tmp_path: Path) -> None:
    good = {"step": 7, "at": 1.5}
    files = {
        "progress-a.json": json.dumps(good),
        "progress-b.json": "not json",
        "progress-c.json": json.dumps({"step": -1, "at": 1}),
        "progress-d.json": json.dumps({"step": True, "at": 1}),
        "progress-e.json": json.dumps({"step": 1, "at": "now"}),
        "progress-f.json": json.dumps([1, 2]),
        "launcher-a.json": json.dumps(good),
        "resume.json": json.dumps(good),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert read_progress(tmp_path) == {"a": Progress(7, 1.5)}
    assert read_progress(tmp_path / "missing") == {}
    clear_progress(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launcher-a.json", "resume.json"]
    clear_progress(tmp_path / "missing")


def test_a_record_says_where_its_trainer_started(tmp_path: Path) -> None:
    """firstStep/firstAt (goodput: the trainer's pace over its epoch); a record whose start is
    missing or inconsistent still counts as progress, without a start."""
    report = ProgressReporter(tmp_path, "t")
    report(7)
    first = read_progress(tmp_path)["t"]
    report(9)
    record = read_progress(tmp_path)["t"]
    assert (record.first_step, record.first_at) == (7, first.at)
    bads: list[dict[str, object]] = [
        {"firstStep": 8},
        {"firstStep": 10, "firstAt": 1},
        {"firstStep": 1, "firstAt": 9},
        {"firstStep": True, "firstAt": 1},
        {"firstStep": 1, "firstAt": "1"},
    ]
    for bad in bads:
        (tmp_path / "progress-x.json").write_text(json.dumps({"step": 9, "at": 5, **bad}))
        assert read_progress(tmp_path)["x"] == Progress(9, 5.0), bad


def test_the_span_of_a_pods_trainers_and_its_encoding() -> None:
    records = {
        "a": Progress(20, 30.0, None, 11, 10.5),
        "b": Progress(21, 30.5, None, 11, 10.0),
        "c": Progress(5, 3.0),  # says nothing of its start: left out
    }
    span = span_of(records)
    assert span == ProgressSpan(11, 10.0, 21, 30.5)
    assert span.step_seconds == pytest.approx(2.05)
    assert decode_span(encode_span(span)) == span
    assert span_of({"c": Progress(5, 3.0)}) is None
    assert ProgressSpan(3, 1.0, 3, 1.0).step_seconds is None
    for bad in ["", "1@2", "1@2,3", "1@2,3@4,5@6", "a@1,2@3", "1@-1,2@3", "3@1,2@3", "1@3,2@1"]:
        assert decode_span(bad) is None, bad
