"""The agent as a real process against the real API server: it reports through its pod's
annotations, holds and opens the barrier, adopts or restarts on an epoch change, survives
missing or malformed state, and works with least-privilege RBAC.

There is no kubelet: the pod object only carries the agent's report, and the test plays the
controller by patching the GangState status."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from jobset_inplace import names
from jobset_inplace.trainer import ResumeInfo
from jobset_inplace.trainer.checkpoints import COMPLETE_MARKER, RETIRED_MARKER, decode_steps
from jobset_inplace.trainer.layouts import SET_ASIDE_DIR
from testbed.controlplane import ControlPlane
from testbed.gangsim import CRD_NAME
from testbed.kube import Clients, wait_for
from testbed.processes import free_port

from .agentproc import POLL, WAIT, AgentProc, StartAgent, checkpoints

pytestmark = pytest.mark.integration

RESTART_CODE = 88


# --- the GangState and pods (the test plays the controller) ------------------------------------


def create_gangstate(kube: Clients, ns: str, name: str, status: dict[str, Any] | None) -> None:
    body = {
        "apiVersion": names.API_VERSION,
        "kind": names.GANGSTATE_KIND,
        "metadata": {"name": name},
        "spec": {"jobSetName": name},
    }
    kube.custom.create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.GANGSTATE_PLURAL, body
    )
    if status is not None:
        set_status(kube, ns, name, status)


def set_status(kube: Clients, ns: str, name: str, status: dict[str, Any]) -> None:
    """Merge-patch the status subresource, as the controller does."""
    kube.custom.patch_namespaced_custom_object_status(
        names.GROUP, names.VERSION, ns, names.GANGSTATE_PLURAL, name, {"status": status}
    )


def closed(epoch: int) -> dict[str, Any]:
    return {"phase": "Recovering", "epoch": epoch, "barrierOpen": False}


def opened(epoch: int, step: int | None) -> dict[str, Any]:
    return {"phase": "Running", "epoch": epoch, "barrierOpen": True, "resumeStep": step}


def create_pod(kube: Clients, ns: str, name: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"example.com/keep": "me"}},
        "spec": {"containers": [{"name": "trainer", "image": "busybox"}]},
    }
    kube.core.create_namespaced_pod(ns, pod)


def pod_annotations(kube: Clients, ns: str, pod: str) -> dict[str, str]:
    return dict(kube.core.read_namespaced_pod(pod, ns).metadata.annotations or {})


def reported(kube: Clients, ns: str, pod: str) -> tuple[str | None, str | None]:
    a = pod_annotations(kube, ns, pod)
    return a.get(names.REPORT_EPOCH), a.get(names.REPORT_STEPS)


def wait_reported(kube: Clients, ns: str, pod: str, epoch: int) -> str:
    """Wait until the pod reports `epoch`; its reported steps."""

    def check() -> tuple[str | None, str | None] | None:
        r = reported(kube, ns, pod)
        return r if r[0] == str(epoch) else None

    return wait_for(f"pod {pod} to report epoch {epoch}", check, WAIT, POLL)[1] or ""


# --- tests ---------------------------------------------------------------------------------------


def test_report_open_restart(kube: Clients, namespace: str, start_agent: StartAgent) -> None:
    """The whole cycle of one epoch: report, hold, open with the resume step, restart."""
    create_gangstate(kube, namespace, "gang", closed(1))
    create_pod(kube, namespace, "gang-0")
    agent = start_agent("gang-0", "gang")

    steps = wait_reported(kube, namespace, "gang-0", 1)
    seen_after = time.monotonic() - agent.started
    assert steps == "200,100"  # complete steps of both tiers, newest first; step-300 is partial
    assert decode_steps(steps) == [200, 100]  # what the controller parses
    ann = pod_annotations(kube, namespace, "gang-0")
    assert ann["example.com/keep"] == "me"  # only its own keys were written
    assert set(ann) == {"example.com/keep", names.REPORT_EPOCH, names.REPORT_STEPS}
    print(
        f"\nagent start -> epoch reported: {agent.own_latency():.3f} s (agent's own measure), "
        f"{seen_after:.3f} s (spawn -> annotation seen by the test)"
    )

    assert "closed" in agent.wait_barrier(503)
    assert agent.get("/healthz")[0] == 200
    assert agent.resume() is None  # the previous epoch's resume.json was removed at start

    set_status(kube, namespace, "gang", opened(1, 100))
    assert "resume from step 100" in agent.wait_barrier(200)
    assert agent.resume() == ResumeInfo(epoch=1, resume_step=100, gang=f"{namespace}/gang")
    # Steps of the abandoned run (newer than the resume step) were retired, older ones kept.
    assert (agent.local / "step-200" / RETIRED_MARKER).exists()
    assert not (agent.local / "step-200" / COMPLETE_MARKER).exists()
    assert (agent.local / "step-100" / COMPLETE_MARKER).exists()
    assert (agent.persistent / "step-100" / COMPLETE_MARKER).exists()

    set_status(kube, namespace, "gang", closed(2))
    assert agent.wait_exit() == RESTART_CODE
    assert agent.resume() is None
    assert "exiting with 88" in agent.text()


def test_a_framework_layout_is_reported_and_prepared_for_its_own_resume(
    kube: Clients, namespace: str, start_agent: StartAgent
) -> None:
    """checkpoint-layout hf-trainer: the agent reports the Trainer's complete checkpoint-<S>
    steps and, at the barrier, leaves the gang's step the newest one the Trainer's own
    get_last_checkpoint finds (the newer ones set aside in the same root)."""
    create_gangstate(kube, namespace, "gang", closed(1))
    create_pod(kube, namespace, "gang-0")

    def trainer_checkpoints(local: Path, persistent: Path) -> None:
        for step in (100, 200, 300):
            d = local / f"checkpoint-{step}"
            d.mkdir(parents=True)
            (d / "model.safetensors").write_text("w")
            if step != 300:  # 300 is being written: no trainer_state.json yet
                (d / "trainer_state.json").write_text("{}")
        checkpoints(persistent, [100])  # the contract's step-100: not this layout's

    agent = start_agent(
        "gang-0", "gang", tiers=trainer_checkpoints, JSI_CHECKPOINT_LAYOUT="hf-trainer"
    )
    assert wait_reported(kube, namespace, "gang-0", 1) == "200,100"

    set_status(kube, namespace, "gang", opened(1, 100))
    assert "resume from step 100" in agent.wait_barrier(200)
    left = sorted(p.name for p in agent.local.glob("checkpoint-*"))
    assert left == ["checkpoint-100"]
    aside = agent.local / SET_ASIDE_DIR / "epoch-1"
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint-200", "checkpoint-300"]
    assert "set aside newer steps [300,200]" in agent.text()


def test_agent_finding_barrier_open_does_not_open(
    kube: Clients, namespace: str, start_agent: StartAgent
) -> None:
    """An agent that starts after its epoch's barrier opened was not counted: it waits, and
    joins the next epoch in place."""
    create_gangstate(kube, namespace, "late", opened(3, 100))
    create_pod(kube, namespace, "late-0")
    agent = start_agent("late-0", "late")

    wait_reported(kube, namespace, "late-0", 3)
    # ... and says so on its pod: the controller treats a member waiting for the next epoch
    # as a failure, even one it did not see (it was down when the pod restarted in place)
    assert pod_annotations(kube, namespace, "late-0").get(names.REPORT_LATE) == "3"
    assert "did not take part" in agent.wait_barrier(503, "did not take part")
    # More status traffic for the same epoch changes nothing.
    set_status(kube, namespace, "late", {"members": {"expected": 2, "reported": 2}})
    set_status(kube, namespace, "late", opened(3, 200))
    assert agent.barrier()[0] == 503

    # Had it opened on any of those, this bump would make it exit with the restart code.
    set_status(kube, namespace, "late", closed(4))
    wait_reported(kube, namespace, "late-0", 4)
    assert names.REPORT_LATE not in pod_annotations(kube, namespace, "late-0"), "in time"
    agent.wait_barrier(503, "closed")
    assert agent.alive()
    assert agent.resume() is None
    set_status(kube, namespace, "late", opened(4, None))
    assert "from scratch" in agent.wait_barrier(200)
    assert agent.resume() == ResumeInfo(epoch=4, resume_step=None, gang=f"{namespace}/late")
    assert agent.alive()


def test_epoch_bump_before_open_is_adopted_in_place(
    kube: Clients, namespace: str, start_agent: StartAgent
) -> None:
    create_gangstate(kube, namespace, "bump", closed(1))
    create_pod(kube, namespace, "bump-0")
    agent = start_agent("bump-0", "bump")
    wait_reported(kube, namespace, "bump-0", 1)

    set_status(kube, namespace, "bump", closed(2))
    assert wait_reported(kube, namespace, "bump-0", 2) == "200,100"
    agent.wait_log("adopted epoch 2 in place")
    assert agent.alive()
    assert agent.barrier()[0] == 503

    set_status(kube, namespace, "bump", opened(2, 200))
    agent.wait_barrier(200)
    assert agent.resume() == ResumeInfo(epoch=2, resume_step=200, gang=f"{namespace}/bump")
    assert agent.alive()


def test_asked_to_look_again_it_reports_the_step_another_member_kept_since(
    kube: Clients, namespace: str, start_agent: StartAgent
) -> None:
    """A root shared with another member: after this agent reported, the other member's
    trainer kept step 317 there. The status asks members lacking 317 to look again: the agent
    scans again and reports it, saying it looked again; then opens on it."""
    create_gangstate(kube, namespace, "again", closed(1))
    create_pod(kube, namespace, "again-0")
    agent = start_agent("again-0", "again")
    assert wait_reported(kube, namespace, "again-0", 1) == "200,100"
    kept = agent.persistent / "step-317"
    kept.mkdir()
    (kept / COMPLETE_MARKER).touch()
    ask = {"epoch": 1, "steps": [317], "deadline": "2030-01-01T00:00:00Z"}
    set_status(kube, namespace, "again", {**closed(1), "stepRecheck": ask})

    def looked_again() -> dict[str, str] | None:
        a = pod_annotations(kube, namespace, "again-0")
        return a if a.get(names.REPORT_RECHECKED) == "1" else None

    ann = wait_for("the report that looked again", looked_again, WAIT, POLL)
    assert ann[names.REPORT_EPOCH] == "1"
    assert decode_steps(ann[names.REPORT_STEPS]) == [317, 200, 100]
    agent.wait_log("looked at the checkpoint steps of epoch 1 again")
    assert agent.barrier()[0] == 503, "asked to look again, not to open"

    set_status(kube, namespace, "again", {**opened(1, 317), "stepRecheck": None})
    assert "resume from step 317" in agent.wait_barrier(200)
    assert (kept / COMPLETE_MARKER).exists()
    assert agent.text().count("looked at the checkpoint steps") == 1


def test_waits_for_missing_gangstate(
    kube: Clients, namespace: str, start_agent: StartAgent
) -> None:
    """No GangState yet, then one without a status: the agent waits (watching), reports once
    the controller sets the epoch."""
    create_pod(kube, namespace, "early-0")
    agent = start_agent("early-0", "early")
    agent.wait_log("not found")
    assert "not found" in agent.wait_barrier(503, "not found")

    create_gangstate(kube, namespace, "early", None)
    agent.wait_barrier(503, "no status epoch yet")
    assert reported(kube, namespace, "early-0") == (None, None)

    set_status(kube, namespace, "early", closed(5))
    wait_reported(kube, namespace, "early-0", 5)
    assert agent.alive()


def test_unreachable_or_unauthorised_api_is_retried(
    kube: Clients, control_plane: ControlPlane, namespace: str, start_agent: StartAgent
) -> None:
    """Nothing listening, then a rejected token: the agent logs, retries with backoff and
    waits; once the token file holds a valid token (rotation), it reports."""
    create_gangstate(kube, namespace, "api", closed(1))
    create_pod(kube, namespace, "api-0")
    nowhere = start_agent("api-0", "api", JSI_API_SERVER=f"https://127.0.0.1:{free_port()}")
    nowhere.wait_log("ConnectionRefusedError.*retrying")
    assert "retrying" in nowhere.wait_barrier(503, "retrying")
    assert nowhere.alive()

    agent = start_agent("api-0", "api", token="not-a-valid-token")
    agent.wait_log("401 Unauthorized.*retrying")
    agent.wait_barrier(503, "401")
    assert reported(kube, namespace, "api-0") == (None, None)
    agent.token_file.write_text(control_plane.token)
    wait_reported(kube, namespace, "api-0", 1)
    assert agent.alive()
    assert nowhere.alive()
    nowhere.proc.send_signal(signal.SIGTERM)
    assert nowhere.wait_exit(5) == 0


@pytest.fixture
def loose_status_schema(control_plane: ControlPlane, gangstate_crd: None) -> Iterator[None]:
    """Let the API server store a status our CRD schema rejects, as it would serve an object
    stored under an older, looser schema. Restores the schema afterwards."""
    kubectl = control_plane.kubectl()
    crd = json.loads(kubectl.run("get", "crd", CRD_NAME, "-o", "json"))
    path = "/spec/versions/0/schema/openAPIV3Schema/properties/status"
    original = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    loose = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

    def replace(value: dict[str, Any]) -> None:
        patch = json.dumps([{"op": "replace", "path": path, "value": value}])
        kubectl.run("patch", "crd", CRD_NAME, "--type=json", "-p", patch)

    replace(loose)
    try:
        yield
    finally:
        replace(original)


def _until_accepted(kube: Clients, ns: str, name: str, status: dict[str, Any]) -> None:
    """Patch `status`, retrying while the API server still applies the strict schema."""

    def attempt() -> bool:
        try:
            set_status(kube, ns, name, status)
        except ApiException as e:
            if e.status == 422:
                return False
            raise
        return True

    wait_for(f"malformed status {status} accepted", attempt, 30, 0.1)


def test_malformed_status_never_restarts(
    kube: Clients, namespace: str, start_agent: StartAgent, loose_status_schema: None
) -> None:
    create_gangstate(kube, namespace, "bad", closed(1))
    for pod in ("bad-0", "bad-1"):
        create_pod(kube, namespace, pod)
    running = start_agent("bad-0", "bad")
    wait_reported(kube, namespace, "bad-0", 1)
    set_status(kube, namespace, "bad", opened(1, 100))
    running.wait_barrier(200)

    # A malformed epoch while the trainer runs: logged, ignored; never the restart code.
    _until_accepted(kube, namespace, "bad", {**opened(1, 100), "epoch": "2"})
    running.wait_log("ignoring malformed GangState .*status.epoch")
    set_status(kube, namespace, "bad", {**opened(1, 100), "epoch": -5})
    running.wait_log("ignoring malformed GangState .*-5")
    assert running.alive()
    assert running.barrier()[0] == 200  # an open barrier stays open

    # An agent starting on a malformed status reports nothing and waits for a fix.
    set_status(kube, namespace, "bad", {**closed(1), "barrierOpen": "yes"})
    running.wait_log("ignoring malformed GangState .*barrierOpen")
    fresh = start_agent("bad-1", "bad")
    fresh.wait_log("ignoring malformed GangState .*barrierOpen")
    assert "malformed" in fresh.wait_barrier(503, "malformed")
    assert reported(kube, namespace, "bad-1") == (None, None)

    set_status(kube, namespace, "bad", closed(1))
    wait_reported(kube, namespace, "bad-1", 1)
    assert running.alive()
    assert fresh.alive()
    assert running.barrier()[0] == 200


def test_sigterm_exits_zero(kube: Clients, namespace: str, start_agent: StartAgent) -> None:
    """SIGTERM ends the agent with 0 whatever it is doing: waiting for a missing GangState,
    holding a closed barrier, or watching with the barrier open."""
    # (Not parametrized: the namespace fixture derives the namespace from the test name.)
    for state in ("missing", "waiting", "open"):
        pod, gang = f"term-{state}", f"term-{state}"
        create_pod(kube, namespace, pod)
        if state != "missing":
            create_gangstate(kube, namespace, gang, closed(1))
        agent = start_agent(pod, gang)
        if state == "missing":
            agent.wait_barrier(503, "not found")
        else:
            wait_reported(kube, namespace, pod, 1)
        if state == "open":
            set_status(kube, namespace, gang, opened(1, 100))
            agent.wait_barrier(200)
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.wait_exit(5) == 0, state
        assert "SIGTERM received" in agent.text()


def test_bad_config_exits_2(
    kube: Clients, namespace: str, start_agent: StartAgent, tmp_path: Path
) -> None:
    for env, variable in [
        ({"POD_NAME": ""}, "POD_NAME"),
        ({"JSI_RESTART_EXIT_CODE": "2"}, "JSI_RESTART_EXIT_CODE"),
        ({"JSI_PROBE_PORT": "http"}, "JSI_PROBE_PORT"),
        ({"JSI_CA_FILE": str(tmp_path / "nope")}, "JSI_CA_FILE"),
        ({"JSI_RESTART_SCOPE": "container"}, "JSI_RESTART_SCOPE"),
        ({"JSI_RESTART_SCOPE": "process"}, "JSI_LAUNCHED_CONTAINERS"),
        ({"JSI_LAUNCHED_CONTAINERS": "Trainer!"}, "JSI_LAUNCHED_CONTAINERS"),
        ({"JSI_STOP_GRACE_SECONDS": "-1"}, "JSI_STOP_GRACE_SECONDS"),
    ]:
        agent = start_agent("cfg-0", "cfg", **env)
        assert agent.wait_exit() == 2, agent.text()
        lines = agent.text().strip().splitlines()
        assert len(lines) == 1, lines
        assert "configuration error" in lines[0]
        assert variable in lines[0]


def test_least_privilege_rbac(kube: Clients, namespace: str, start_agent: StartAgent) -> None:
    """The agent needs exactly: get+watch on its own GangState (by name), patch on its pod."""
    create_gangstate(kube, namespace, "rbac", closed(1))
    create_pod(kube, namespace, "rbac-0")
    rbac = client.RbacAuthorizationV1Api(kube.api)
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "agent"},
            "rules": [
                {
                    "apiGroups": [names.GROUP],
                    "resources": [names.GANGSTATE_PLURAL],
                    "resourceNames": ["rbac"],
                    "verbs": ["get", "watch"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "resourceNames": ["rbac-0"],
                    "verbs": ["patch"],
                },
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent"},
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": namespace}],
        },
    )
    token = kube.core.create_namespaced_service_account_token(
        "agent", namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token

    agent = start_agent("rbac-0", "rbac", token=token)
    assert wait_reported(kube, namespace, "rbac-0", 1) == "200,100"
    set_status(kube, namespace, "rbac", opened(1, 200))
    agent.wait_barrier(200)
    set_status(kube, namespace, "rbac", closed(2))
    assert agent.wait_exit() == RESTART_CODE
    assert "Forbidden" not in agent.text(), agent.text()


def test_start_to_report_latency(kube: Clients, namespace: str, start_agent: StartAgent) -> None:
    """Not a timed test (the target is checked by the benchmark): prints several runs."""
    create_gangstate(kube, namespace, "fast", closed(1))
    own, seen = [], []
    for i in range(5):
        pod = f"fast-{i}"
        create_pod(kube, namespace, pod)
        agent = start_agent(pod, "fast")
        wait_reported(kube, namespace, pod, 1)
        seen.append(time.monotonic() - agent.started)
        agent.wait_log("reported epoch 1")
        own.append(agent.own_latency())
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.wait_exit(5) == 0
    print(
        "\nagent start -> epoch reported, 5 runs: own measure "
        + ", ".join(f"{x:.3f}" for x in own)
        + f" s (median {statistics.median(own):.3f}); spawn -> annotation seen "
        + ", ".join(f"{x:.3f}" for x in seen)
        + f" s (median {statistics.median(seen):.3f})"
    )


# --- process restart scope: the agent and a real launcher share the state directory ------------

# The trainer under the launcher: notes each start, exits with the code written to `exit-now`.
TRAINER = r"""
import os, sys, time
d = sys.argv[1]
with open(os.path.join(d, "starts"), "a") as f:
    f.write("%s %s\n" % (os.environ["JSI_EPOCH"], os.environ["JSI_RESUME_STEP"]))
while True:
    p = os.path.join(d, "exit-now")
    if os.path.exists(p):
        code = int(open(p).read()); os.unlink(p); sys.exit(code)
    time.sleep(0.01)
"""


def start_launcher(agent: AgentProc) -> subprocess.Popen[bytes]:
    """The main container's process as the transform makes it: the launcher the agent
    installed, running the trainer."""
    installed = agent.state_dir / "launcher.py"
    wait_for("the agent installs the launcher", installed.exists, WAIT, POLL)
    trainer = agent.state_dir.parent / "trainer.py"
    trainer.write_text(TRAINER)
    env = {**os.environ, "JSI_STATE_DIR": str(agent.state_dir), "JSI_CONTAINER_NAME": "trainer"}
    cmd = [sys.executable, str(installed), "--", sys.executable, str(trainer)]
    return subprocess.Popen([*cmd, str(agent.state_dir.parent)], env=env)


def trainer_starts(agent: AgentProc) -> list[str]:
    path = agent.state_dir.parent / "starts"
    return path.read_text().splitlines() if path.exists() else []


PROCESS_SCOPE = {"JSI_RESTART_SCOPE": "process", "JSI_LAUNCHED_CONTAINERS": "trainer"}


def test_process_scope_restarts_the_trainer_process_not_the_agent(
    kube: Clients, namespace: str, start_agent: StartAgent
) -> None:
    """A crash is reported on the pod; a new epoch stops the trainer (or finds it exited),
    the agent reports the new epoch itself and the launcher starts the trainer again: no
    process but the trainer's ends."""
    create_gangstate(kube, namespace, "proc", closed(1))
    create_pod(kube, namespace, "proc-0")
    agent = start_agent("proc-0", "proc", **PROCESS_SCOPE)
    assert agent.get("/started")[0] == 200 or agent.wait_barrier(503)
    launcher = start_launcher(agent)
    try:
        wait_reported(kube, namespace, "proc-0", 1)
        assert trainer_starts(agent) == []  # barrier closed: the launcher holds the trainer
        set_status(kube, namespace, "proc", opened(1, 100))
        wait_for("trainer started in epoch 1", lambda: trainer_starts(agent) == ["1 100"], WAIT)

        tmp = agent.state_dir.parent / ".exit-now"  # atomically: the trainer polls for the file
        tmp.write_text("3")
        tmp.replace(agent.state_dir.parent / "exit-now")  # the trainer crashes
        wait_for(
            "the crash reported on the pod",
            lambda: pod_annotations(kube, namespace, "proc-0").get(names.REPORT_EXITED) == "1",
            WAIT,
            POLL,
        )
        agent.wait_log("trainer trainer exited 3 in epoch 1: reported")

        set_status(kube, namespace, "proc", closed(2))  # the controller starts a recovery
        wait_reported(kube, namespace, "proc-0", 2)
        assert names.REPORT_EXITED not in pod_annotations(kube, namespace, "proc-0")
        set_status(kube, namespace, "proc", opened(2, 100))
        wait_for("trainer again in epoch 2", lambda: trainer_starts(agent)[-1:] == ["2 100"], WAIT)

        set_status(kube, namespace, "proc", closed(3))  # another member failed: stop, rejoin
        wait_reported(kube, namespace, "proc-0", 3)
        agent.wait_log("trainers stopped in [0-9.]+ s, joining epoch 3 in place")
        assert agent.resume() is None
        set_status(kube, namespace, "proc", opened(3, 100))
        wait_for("trainer again in epoch 3", lambda: trainer_starts(agent)[-1:] == ["3 100"], WAIT)
        assert trainer_starts(agent) == ["1 100", "2 100", "3 100"]
        assert agent.alive()
        assert launcher.poll() is None
        assert "exiting with 88" not in agent.text()
    finally:
        launcher.send_signal(signal.SIGTERM)  # it stops its trainer, then exits
        try:
            launcher.wait(10)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()


def test_process_scope_restarts_the_pod_when_a_launcher_does_not_stop(
    kube: Clients, namespace: str, start_agent: StartAgent
) -> None:
    """A launcher that never confirms the stop (here: its state says running, and no launcher
    is there to change it) must not leave an old trainer beside the new epoch: the agent
    falls back to the restart exit code (RestartAllContainers)."""
    create_gangstate(kube, namespace, "stuck", closed(1))
    create_pod(kube, namespace, "stuck-0")
    agent = start_agent("stuck-0", "stuck", JSI_STOP_GRACE_SECONDS="0", **PROCESS_SCOPE)
    wait_reported(kube, namespace, "stuck-0", 1)
    set_status(kube, namespace, "stuck", opened(1, 100))
    wait_for("resume.json of epoch 1", lambda: agent.resume() is not None, WAIT, POLL)
    (agent.state_dir / "launcher-trainer.json").write_text(
        '{"state": "running", "epoch": 1, "code": null}'
    )
    set_status(kube, namespace, "stuck", closed(2))
    assert agent.wait_exit(WAIT) == RESTART_CODE
    assert "did not stop their trainers within 5 s: restarting the whole pod" in agent.text()
