"""The agent's pure parts: its decision rule (barrier, adoption, restart), GangState parsing,
configuration from the environment, backoff and log muting."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobset_inplace.agent.config import DEFAULT_PROBE_PORT, ConfigError, load_config
from jobset_inplace.agent.log import Log
from jobset_inplace.agent.logic import (
    Action,
    AgentLogic,
    Open,
    Report,
    Restart,
    Wait,
    failed_exit,
    trainers_stopped,
)
from jobset_inplace.backoff import Backoff, Retries
from jobset_inplace.names import DEFAULT_RESTART_SCOPE
from jobset_inplace.protocol.gangstate import GangView, MalformedStatus, parse_gangstate
from jobset_inplace.trainer.checkpoints import MAX_STEP


def closed(epoch: int) -> GangView:
    return GangView(epoch=epoch, barrier_open=False, resume_step=None)


def opened(epoch: int, step: int | None = 100) -> GangView:
    return GangView(epoch=epoch, barrier_open=True, resume_step=step)


def run(logic: AgentLogic, view: GangView) -> list[Action]:
    """What the runner does with one observed view when every action succeeds."""
    actions: list[Action] = []
    for _ in range(4):
        action = logic.step(view)
        actions.append(action)
        if isinstance(action, Report):
            logic.reported_epoch(action.epoch, action.barrier_closed)
        elif isinstance(action, Open):
            logic.opened_barrier(action.epoch)
        else:
            return actions
    raise AssertionError(f"no settled decision: {actions}")


# --- the decision rule -------------------------------------------------------------------------


def test_report_then_open_then_restart() -> None:
    logic = AgentLogic()
    first = run(logic, closed(1))
    assert first[0] == Report(1, barrier_closed=True)
    assert isinstance(first[-1], Wait)
    assert "closed" in first[-1].reason
    assert isinstance(run(logic, closed(1))[0], Wait)  # more traffic, same epoch: nothing
    assert run(logic, opened(1, 700))[0] == Open(1, 700)
    assert logic.opened
    assert isinstance(run(logic, opened(1, 700))[0], Wait)  # stays open, nothing to do
    assert run(logic, closed(2)) == [Restart(1, 2)]


def test_last_reporter_opens_on_the_next_view() -> None:
    """The controller may open the barrier right after the last report: the agent reported
    while it was closed, so the first open view opens it."""
    logic = AgentLogic()
    run(logic, closed(4))
    assert run(logic, opened(4, None))[0] == Open(4, None)


def test_agent_finding_its_barrier_open_waits() -> None:
    logic = AgentLogic()
    actions = run(logic, opened(3))
    assert actions[0] == Report(3, barrier_closed=False)
    assert isinstance(actions[-1], Wait)
    assert "did not take part" in actions[-1].reason
    for view in (opened(3), opened(3, 200), opened(3, None)):
        assert isinstance(logic.step(view), Wait)
    assert not logic.opened


def test_late_agent_joins_next_epoch_in_place() -> None:
    logic = AgentLogic()
    run(logic, opened(3))
    assert run(logic, closed(4))[0] == Report(4, barrier_closed=True)  # adopt, no restart
    assert run(logic, opened(4, 300))[0] == Open(4, 300)


def test_barrier_closing_again_while_reported_counts_as_taking_part() -> None:
    logic = AgentLogic()
    run(logic, opened(3))
    run(logic, closed(3))  # the report stands while the barrier is closed: now counted
    assert run(logic, opened(3))[0] == Open(3, 100)


def test_epoch_change_before_open_is_adopted_not_restarted() -> None:
    logic = AgentLogic()
    run(logic, closed(1))
    assert run(logic, closed(2))[0] == Report(2, barrier_closed=True)
    assert logic.epoch == 2
    assert not logic.opened
    assert run(logic, closed(5))[0] == Report(5, barrier_closed=True)
    assert run(logic, opened(5))[0] == Open(5, 100)


def test_epoch_change_to_an_open_barrier_before_open_waits() -> None:
    logic = AgentLogic()
    run(logic, closed(1))
    actions = run(logic, opened(2))  # missed epoch 2's closed phase (e.g. watch down)
    assert actions[0] == Report(2, barrier_closed=False)
    assert isinstance(actions[-1], Wait)
    assert not logic.opened


def test_lower_epoch_is_a_change_too() -> None:
    logic = AgentLogic()
    run(logic, closed(5))
    assert run(logic, closed(1))[0] == Report(1, barrier_closed=True)
    run(logic, opened(1))
    assert run(logic, closed(0)) == [Restart(1, 0)]


def test_failed_report_is_asked_again() -> None:
    logic = AgentLogic()
    assert logic.step(closed(1)) == Report(1, True)  # not confirmed: the patch failed
    assert logic.step(closed(1)) == Report(1, True)
    assert logic.step(opened(1)) == Report(1, False)  # now it would not be counted
    logic.reported_epoch(1, barrier_closed=False)
    assert isinstance(logic.step(opened(1)), Wait)


def test_failed_report_of_new_epoch_keeps_old_epoch() -> None:
    logic = AgentLogic()
    run(logic, closed(1))
    assert logic.step(closed(2)) == Report(2, True)  # not confirmed
    assert logic.epoch == 1
    assert logic.step(closed(2)) == Report(2, True)


def test_failed_open_is_asked_again() -> None:
    logic = AgentLogic()
    run(logic, closed(1))
    assert logic.step(opened(1)) == Open(1, 100)  # not confirmed: resume.json not written
    assert logic.step(opened(1)) == Open(1, 100)
    assert logic.step(closed(2)) == Report(2, True)  # never opened: adopt, no restart


def asked(epoch: int, *steps: int) -> GangView:
    ask = (epoch, frozenset(steps))
    return GangView(epoch=epoch, barrier_open=False, resume_step=None, step_recheck=ask)


def test_asked_to_look_again_reports_once_more_then_waits() -> None:
    logic = AgentLogic()
    assert logic.step(closed(2)) == Report(2, True)
    logic.reported_epoch(2, True, (100, 200))
    assert isinstance(logic.step(closed(2)), Wait)
    assert logic.step(asked(2, 317)) == Report(2, True, recheck=True)
    logic.reported_epoch(2, True, (100, 200), rechecked=True)
    assert isinstance(logic.step(asked(2, 317)), Wait), "once: it did not find 317"
    assert logic.step(opened(2, 200)) == Open(2, 200)


def test_an_ask_for_a_step_it_reported_or_of_another_epoch_is_not_for_it() -> None:
    logic = AgentLogic()
    run(logic, closed(2))
    logic.reported_epoch(2, True, (100, 317))
    assert isinstance(logic.step(asked(2, 317)), Wait)
    assert isinstance(logic.step(asked(2, 317, 100)), Wait)
    stale = GangView(2, False, None, step_recheck=(1, frozenset({400})))
    assert isinstance(logic.step(stale), Wait)
    view = GangView(2, True, 317, step_recheck=(2, frozenset({400})))
    assert logic.step(view) == Open(2, 317), "an open barrier asks nothing"


def test_an_ask_naming_several_steps_is_for_a_member_lacking_any_of_them() -> None:
    logic = AgentLogic()
    run(logic, closed(2))
    logic.reported_epoch(2, True, (20, 30))
    assert logic.step(asked(2, 30, 29)) == Report(2, True, recheck=True)


def test_a_first_report_made_after_the_ask_answers_it() -> None:
    logic = AgentLogic()
    assert logic.step(asked(2, 317)) == Report(2, True, recheck=True)
    logic.reported_epoch(2, True, (100,), rechecked=True)
    assert isinstance(logic.step(asked(2, 317)), Wait)


def test_confirmations_guard_the_rule() -> None:
    logic = AgentLogic()
    logic.step(opened(1))
    logic.reported_epoch(1, barrier_closed=False)
    with pytest.raises(RuntimeError):
        logic.opened_barrier(1)  # did not take part
    run(logic, closed(2))
    run(logic, opened(2))
    with pytest.raises(RuntimeError):
        logic.reported_epoch(3, barrier_closed=True)  # an opened agent only restarts


@dataclass(frozen=True)
class Fail:
    """The next Report/Open action fails (not confirmed)."""


views = st.builds(
    GangView,
    epoch=st.integers(0, 4),
    barrier_open=st.booleans(),
    resume_step=st.none() | st.integers(0, 1000),
    step_recheck=st.none()
    | st.tuples(st.integers(0, 4), st.frozensets(st.sampled_from([100, 200]), min_size=1)),
)
STEPS = (100,)  # what this agent's scans find, in the invariants below


@settings(max_examples=400)
@given(st.lists(views | st.just(Fail()), max_size=40))
def test_rule_invariants(events: list[GangView | Fail]) -> None:
    """Any sequence of statuses and failures: the agent opens only an epoch whose barrier it
    saw closed while (or just before) its report stood, restarts only after opening, never
    reports after opening, and reports an epoch again only to answer an ask to look at its
    steps again, once, while the barrier is closed."""
    logic = AgentLogic()
    report: int | None = None  # the epoch the confirmed annotations say
    counted = False  # that report stood while its barrier was closed (reference model)
    opened_epoch: int | None = None
    fail_next = False
    looked_again: set[int] = set()
    for event in events:
        if isinstance(event, Fail):
            fail_next = True
            continue
        view = event
        if report == view.epoch and not view.barrier_open and opened_epoch is None:
            counted = True
        for _ in range(4):
            action = logic.step(view)
            hypothesis.event(type(action).__name__)  # which rule this example reached (statistics)
            if isinstance(action, Report):
                assert opened_epoch is None
                assert action.epoch == view.epoch
                if fail_next:
                    fail_next = False
                    break
                if report == action.epoch and logic.reported:  # the same epoch again
                    assert action.recheck, "reported an epoch again unasked"
                    ask = view.step_recheck
                    assert ask is not None, view
                    assert ask[0] == action.epoch, view
                    assert 200 in ask[1], view  # it lacks 200, not 100
                    assert not view.barrier_open
                    assert action.epoch not in looked_again, "looked again twice"
                    hypothesis.event("reported again: asked to look again")
                if action.recheck:
                    looked_again.add(action.epoch)
                logic.reported_epoch(
                    action.epoch, action.barrier_closed, STEPS, rechecked=action.recheck
                )
                counted = (counted and report == action.epoch) or action.barrier_closed
                report = action.epoch
            elif isinstance(action, Open):
                assert view.barrier_open
                assert action.epoch == view.epoch == report
                assert counted, "opened without taking part"
                assert action.resume_step == view.resume_step
                if fail_next:
                    fail_next = False
                    break
                logic.opened_barrier(action.epoch)
                opened_epoch = action.epoch
            elif isinstance(action, Restart):
                assert opened_epoch is not None
                assert action.old_epoch == opened_epoch
                assert action.new_epoch == view.epoch != opened_epoch
                return
            else:
                # Waiting while everything needed to open is there would be a deadlock.
                assert not (
                    opened_epoch is None and view.barrier_open and report == view.epoch and counted
                )
                break


# --- parsing the GangState ---------------------------------------------------------------------


def gs(status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "g", "resourceVersion": "7"}, "status": status}


def test_parse_valid_status() -> None:
    view = parse_gangstate(
        gs({"epoch": 3, "barrierOpen": True, "resumeStep": 1200, "phase": "Running"})
    )
    assert view == GangView(epoch=3, barrier_open=True, resume_step=1200, phase="Running")
    assert parse_gangstate(gs({"epoch": 0})) == GangView(0, False, None)
    assert parse_gangstate(gs({"epoch": 2, "barrierOpen": None})) == GangView(2, False, None)
    assert parse_gangstate(gs({"epoch": 2, "barrierOpen": True, "resumeStep": None})) == (
        GangView(2, True, None)
    )


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (
            {"epoch": 3, "steps": [317, 30], "deadline": "2026-12-01T10:00:00Z"},
            (3, frozenset({30, 317})),
        ),
        ({"epoch": 3, "steps": [-1]}, None),
        ({"epoch": 3, "steps": []}, None),
        ({"epoch": 3, "steps": 317}, None),
        ({"epoch": 3, "steps": [317, "30"]}, None),
        ({"epoch": 3, "steps": [True]}, None),
        ({"epoch": "3", "steps": [317]}, None),
        ({"epoch": 3, "steps": [MAX_STEP + 1]}, None),
        ({"epoch": 3, "step": 317}, None),
        ([3, 317], None),
    ],
)
def test_the_ask_to_look_again_is_advisory(
    value: Any, parsed: tuple[int, frozenset[int]] | None
) -> None:
    """A malformed ask is ignored (the barrier opens at its deadline), never a malformed
    status."""
    view = parse_gangstate(gs({"epoch": 3, "stepRecheck": value}))
    assert view is not None
    assert view.step_recheck == parsed


def test_resume_step_matters_only_when_open() -> None:
    view = parse_gangstate(gs({"epoch": 2, "barrierOpen": False, "resumeStep": "x"}))
    assert view == GangView(2, False, None)


@pytest.mark.parametrize("obj", [{"metadata": {}}, gs(None), gs({}), gs({"phase": "Running"})])
def test_no_status_epoch_yet(obj: dict[str, Any]) -> None:
    assert parse_gangstate(obj) is None


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ("nope", "status"),
        ({"epoch": "2"}, "status.epoch"),
        ({"epoch": True}, "status.epoch"),
        ({"epoch": 1.5}, "status.epoch"),
        ({"epoch": -1}, "status.epoch"),
        ({"epoch": MAX_STEP + 1}, "status.epoch"),
        ({"epoch": 1, "barrierOpen": "true"}, "status.barrierOpen"),
        ({"epoch": 1, "barrierOpen": 1}, "status.barrierOpen"),
        ({"epoch": 1, "barrierOpen": True, "resumeStep": "100"}, "status.resumeStep"),
        ({"epoch": 1, "barrierOpen": True, "resumeStep": -3}, "status.resumeStep"),
        ({"epoch": 1, "barrierOpen": True, "resumeStep": False}, "status.resumeStep"),
    ],
)
def test_malformed_status_names_the_field(status: Any, field: str) -> None:
    with pytest.raises(MalformedStatus, match=field.replace(".", r"\.")):
        parse_gangstate(gs(status))


def test_malformed_object() -> None:
    with pytest.raises(MalformedStatus):
        parse_gangstate(["not", "an", "object"])


# --- configuration -----------------------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("t0k3n\n")
    ca.write_text("not parsed here\n")
    return {
        "POD_NAME": "train-workers-0-3-abcde",
        "POD_NAMESPACE": "team-a",
        "JSI_GANGSTATE": "train",
        "JSI_LAUNCHED_CONTAINERS": "trainer",  # process scope, the default
        "JSI_API_SERVER": "https://127.0.0.1:6443",
        "JSI_TOKEN_FILE": str(token),
        "JSI_CA_FILE": str(ca),
    }


def test_config_defaults(env: dict[str, str]) -> None:
    cfg = load_config(env)
    assert cfg.restart_scope == DEFAULT_RESTART_SCOPE
    assert DEFAULT_RESTART_SCOPE.value == "process", "the annotation's default"
    assert cfg.gang == "team-a/train"
    assert cfg.restart_exit_code == 88
    assert cfg.probe_port == DEFAULT_PROBE_PORT == 8187
    assert cfg.state_dir == Path("/var/run/jobset-inplace")
    assert cfg.local_dir is None
    assert cfg.persistent_dir is None
    assert cfg.server == "https://127.0.0.1:6443"
    assert not cfg.hang.enabled
    assert cfg.busy_window is None
    assert cfg.layout.kind.value == "jobset-inplace"


def test_the_default_scope_needs_the_launched_containers(env: dict[str, str]) -> None:
    env.pop("JSI_LAUNCHED_CONTAINERS")
    with pytest.raises(ConfigError, match=r"JSI_LAUNCHED_CONTAINERS must list .*JSI_RESTART_SCOPE"):
        load_config(env)
    assert load_config({**env, "JSI_RESTART_SCOPE": "pod"}).restart_scope == "pod"


def test_config_overrides(env: dict[str, str]) -> None:
    cfg = load_config(
        {
            **env,
            "JSI_STATE_DIR": "/s",
            "JSI_CHECKPOINT_LOCAL_DIR": "/l",
            "JSI_CHECKPOINT_PERSISTENT_DIR": "/p",
            "JSI_RESTART_EXIT_CODE": "99",
            "JSI_PROBE_PORT": "9000",
            "JSI_HANG_TIMEOUT_SECONDS": "600",
            "JSI_STARTUP_TIMEOUT_SECONDS": "90.5",
            "JSI_STRAGGLER_WINDOW_SECONDS": "300",
            "JSI_STRAGGLER_WINDOWS": "5",
            "JSI_CHECKPOINT_LAYOUT": "torch-dcp",
            "JSI_CHECKPOINT_STEP_PATTERN": "ckpt_{step}",
        }
    )
    assert (cfg.layout.kind.value, cfg.layout.names.pattern) == ("torch-dcp", "ckpt_{step}")
    assert (cfg.busy_window, cfg.busy_windows) == (300.0, 5)
    assert (cfg.hang.hang_timeout, cfg.hang.startup_timeout) == (600.0, 90.5)
    assert (cfg.state_dir, cfg.local_dir, cfg.persistent_dir) == (
        Path("/s"),
        Path("/l"),
        Path("/p"),
    )
    assert (cfg.restart_exit_code, cfg.probe_port) == (99, 9000)


def test_config_in_cluster(env: dict[str, str]) -> None:
    del env["JSI_API_SERVER"]
    cfg = load_config(
        {**env, "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    )
    assert cfg.server == "https://10.96.0.1:443"
    v6 = load_config(
        {**env, "KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    )
    assert v6.server == "https://[fd00::1]:443"


def test_config_plain_http_without_token(env: dict[str, str]) -> None:
    cfg = load_config({**env, "JSI_API_SERVER": "http://127.0.0.1:8080", "JSI_TOKEN_FILE": ""})
    assert cfg.token_file is None
    assert cfg.ca_file is None


@pytest.mark.parametrize(
    ("change", "variable"),
    [
        ({"POD_NAME": ""}, "POD_NAME"),
        ({"POD_NAME": "Bad_Name"}, "POD_NAME"),
        ({"POD_NAMESPACE": "a.b"}, "POD_NAMESPACE"),
        ({"JSI_GANGSTATE": ""}, "JSI_GANGSTATE"),
        ({"JSI_RESTART_EXIT_CODE": "0"}, "JSI_RESTART_EXIT_CODE"),
        ({"JSI_RESTART_EXIT_CODE": "1"}, "JSI_RESTART_EXIT_CODE"),
        ({"JSI_RESTART_EXIT_CODE": "2"}, "JSI_RESTART_EXIT_CODE"),
        ({"JSI_RESTART_EXIT_CODE": "256"}, "JSI_RESTART_EXIT_CODE"),
        ({"JSI_RESTART_EXIT_CODE": "eighty-eight"}, "JSI_RESTART_EXIT_CODE"),
        ({"JSI_PROBE_PORT": "0"}, "JSI_PROBE_PORT"),
        ({"JSI_PROBE_PORT": "65536"}, "JSI_PROBE_PORT"),
        ({"JSI_API_SERVER": "127.0.0.1:6443"}, "JSI_API_SERVER"),
        ({"JSI_API_SERVER": ""}, "KUBERNETES_SERVICE_HOST"),
        ({"JSI_TOKEN_FILE": "/nonexistent/token"}, "JSI_TOKEN_FILE"),
        ({"JSI_CA_FILE": "/nonexistent/ca.crt"}, "JSI_CA_FILE"),
        ({"JSI_HANG_TIMEOUT_SECONDS": "0"}, "JSI_HANG_TIMEOUT_SECONDS"),
        ({"JSI_HANG_TIMEOUT_SECONDS": "10m"}, "JSI_HANG_TIMEOUT_SECONDS"),
        ({"JSI_HANG_TIMEOUT_SECONDS": "nan"}, "JSI_HANG_TIMEOUT_SECONDS"),
        ({"JSI_STARTUP_TIMEOUT_SECONDS": "-5"}, "JSI_STARTUP_TIMEOUT_SECONDS"),
        ({"JSI_STARTUP_TIMEOUT_SECONDS": "1e9"}, "JSI_STARTUP_TIMEOUT_SECONDS"),
        ({"JSI_STRAGGLER_WINDOWS": "0"}, "JSI_STRAGGLER_WINDOWS"),
        ({"JSI_STRAGGLER_WINDOWS": "21"}, "JSI_STRAGGLER_WINDOWS"),
        ({"JSI_CHECKPOINT_LAYOUT": "pytorch"}, "JSI_CHECKPOINT_LAYOUT"),
        ({"JSI_CHECKPOINT_LAYOUT": "orbax", "JSI_CHECKPOINT_STEP_PATTERN": "x"}, "STEP_PATTERN"),
    ],
)
def test_config_errors_name_the_variable(
    env: dict[str, str], change: dict[str, str], variable: str
) -> None:
    with pytest.raises(ConfigError, match=variable) as info:
        load_config({**env, **change})
    assert "\n" not in str(info.value)


# --- backoff and logging -----------------------------------------------------------------------


def test_backoff_grows_to_cap_and_resets() -> None:
    rule = Backoff(first=0.2, cap=10.0)
    assert [rule.delay(n) for n in (0, 1, 2, 3, 7, 1000)] == [0.0, 0.2, 0.4, 0.8, 10.0, 10.0]
    b = Retries(rule, jitter=True)
    delays = [b.failed() for _ in range(10)]
    assert 0.1 <= delays[0] <= 0.2
    assert all(d <= 10.0 for d in delays)
    assert delays[-1] >= 5.0
    b.succeeded()
    assert b.failed() <= 0.2
    assert Retries(rule).failed() == 0.2  # no jitter: the rule's delay


def test_log_repeat_mutes_identical_messages() -> None:
    out = io.StringIO()
    log = Log(out, every=60.0)
    for _ in range(3):
        log.repeat("gs", "WARN", "GangState ns/g not found")
    log.repeat("gs", "WARN", "something else")
    log.clear("gs")
    log.repeat("gs", "WARN", "something else")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].endswith("WARN GangState ns/g not found")
    assert lines[0][:4].isdigit()
    assert "Z WARN" in lines[0]


def test_log_repeat_reports_muted_count_after_interval() -> None:
    out, now = io.StringIO(), [0.0]
    log = Log(out, every=60.0, clock=lambda: now[0])
    for t in (0.0, 10.0, 20.0, 61.0):
        now[0] = t
        log.repeat("gs", "WARN", "again")
    assert out.getvalue().splitlines()[-1].endswith("WARN again (repeated 2 more times)")
    assert len(out.getvalue().splitlines()) == 2


# --- process restart scope: the launchers' states ------------------------------------------


def test_trainers_stopped_only_when_no_launcher_runs_one() -> None:
    assert trainers_stopped({})
    assert trainers_stopped({"a": None, "b": ("waiting", None, None)})
    assert trainers_stopped({"a": ("stopped", 2, 143), "b": ("exited", 2, 3)})
    assert not trainers_stopped({"a": ("stopped", 2, 143), "b": ("running", 2, None)})


def test_failed_exit_is_a_non_zero_exit_in_the_running_epoch() -> None:
    states = {"b": ("exited", 2, 3), "a": ("exited", 2, 0), "c": ("running", 2, None)}
    assert failed_exit(states, 2) == ("b", 3)
    assert failed_exit(states, 3) is None  # an older epoch's exit is no failure of this one
    assert failed_exit(states, None) is None  # no epoch running (barrier closed)
    assert failed_exit({"a": ("exited", 2, 0)}, 2) is None  # success
    assert failed_exit({"a": ("stopped", 2, 137)}, 2) is None  # stopped by us, not a failure
