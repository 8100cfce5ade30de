"""A namespace nobody prepared, a JobSet that runs as a ServiceAccount of its own, on the real
kubelet nodes with the in-cluster install: the controller gives the agents their rights there
(core/agent_access.py), the gang trains and recovers in place, and from inside a member pod,
with the token its pods run with, every write an agent must not make is refused by the
admission policy while its own pod's reports are not; with the JobSet gone, the garbage
collector removes what the controller made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core.agent_access import AGENT_BINDING, AGENT_SERVICE_ACCOUNT
from testbed.controller import member_pods
from testbed.demo import (
    assert_recovered_in_place,
    barrier_opened,
    inject_failure,
    member_uids,
    python_in_trainer,
    training_gang,
)
from testbed.install import Installation
from testbed.kube import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION, Clients, wait_for
from testbed.versions import binaries

pytestmark = pytest.mark.e2e

MEMBERS = 2
ACCOUNT = "trainer"

# Runs in member 0's trainer container with the token its pod mounts: each write as a JSON
# line {"name", "status", "body"} (status 0: no answer).
ATTEMPTS = r"""
import json, os, ssl, sys, urllib.request
SA = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(f"{SA}/token").read()
ns, me, other, gangstate = sys.argv[1:5]
host = os.environ["KUBERNETES_SERVICE_HOST"]
port = os.environ["KUBERNETES_SERVICE_PORT"]
ctx = ssl.create_default_context(cafile=f"{SA}/ca.crt")

def call(name, method, path, body=None, kind="application/merge-patch+json"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"https://{host}:{port}{path}", data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", kind)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    print(json.dumps({"name": name, "status": status, "body": text[:600]}), flush=True)

pods = f"/api/v1/namespaces/{ns}/pods"
call("read its GangState", "GET", gangstate)
call("its own report", "PATCH", f"{pods}/{me}",
     {"metadata": {"annotations": {"jobset-inplace.dev/e2e-probe": "1"}}})
for name, pod, body in json.loads(sys.argv[5]):
    call(name, "PATCH", f"{pods}/{pod}", body)
"""

REFUSED = [
    ("another member's exited report", "other",
     {"metadata": {"annotations": {names.REPORT_EXITED: "1"}}}),
    ("another member's epoch", "other", {"metadata": {"annotations": {names.REPORT_EPOCH: "9"}}}),
    ("its own labels", "me", {"metadata": {"labels": {"e2e": "relabelled"}}}),
    ("its own finalizers", "me", {"metadata": {"finalizers": ["example.com/keep"]}}),
    ("another annotation of its own", "me",
     {"metadata": {"annotations": {"example.com/note": "x"}}}),
    ("its own activeDeadlineSeconds", "me", {"spec": {"activeDeadlineSeconds": 86400}}),
    ("its own tolerations", "me",
     {"spec": {"tolerations": [{"key": "example.com/any", "operator": "Exists"}]}}),
]  # fmt: skip


def test_a_namespace_nobody_prepared_runs_a_gang_under_its_own_account_confined(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str
) -> None:
    rbac = client.RbacAuthorizationV1Api(kube.api)
    read_account = kube.core.read_namespaced_service_account
    assert or_none(read_account, AGENT_SERVICE_ACCOUNT, namespace) is None
    assert or_none(rbac.read_namespaced_role_binding, AGENT_BINDING, namespace) is None
    # the user's own account, as a team would have it: no rights of ours
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": ACCOUNT}})

    training_gang(
        kube, cluster_kubeconfig, namespace, "gang", MEMBERS, service_account=ACCOUNT
    )  # trains, so its agents read and report: nothing was applied in the namespace by hand
    js = kube.custom.get_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, "gang"
    )
    binding = rbac.read_namespaced_role_binding(AGENT_BINDING, namespace)
    assert [s.name for s in binding.subjects] == [AGENT_SERVICE_ACCOUNT, ACCOUNT]
    assert [o.uid for o in binding.metadata.owner_references] == [js["metadata"]["uid"]]

    pods = member_pods(kube, namespace, "gang")
    assert {p.spec.service_account_name for p in pods.values()} == {ACCOUNT}
    me, other = pods["0"].metadata.name, pods["1"].metadata.name
    attempts = [(what, {"me": me, "other": other}[who], body) for what, who, body in REFUSED]
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster_kubeconfig), "-n", namespace]
    gangstate = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/gangstates/gang"
    done = python_in_trainer(
        kubectl, me, ATTEMPTS, [namespace, me, other, gangstate, json.dumps(attempts)]
    )
    results = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert len(results) == 2 + len(REFUSED), (done.stdout, done.stderr)
    for allowed in ("read its GangState", "its own report"):
        assert results[allowed]["status"] == 200, results[allowed]
    for what, _, _ in REFUSED:
        r = results[what]
        assert r["status"] == 403, r
        assert names.AGENT_POLICY in r["body"], r
    after = member_pods(kube, namespace, "gang")
    assert after["0"].metadata.annotations["jobset-inplace.dev/e2e-probe"] == "1"
    assert after["0"].metadata.labels.get("e2e") is None
    assert after["0"].spec.active_deadline_seconds is None
    assert names.REPORT_EXITED not in (after["1"].metadata.annotations or {})

    # and it recovers in place as any gang does
    before = member_uids(kube, namespace, "gang")
    inject_failure(cluster_kubeconfig, namespace, other)
    st = barrier_opened(kube, namespace, "gang", 2)
    assert_recovered_in_place(
        kube, cluster_kubeconfig, namespace, "gang", MEMBERS, state=st, before=before
    )

    # the JobSet gone, the garbage collector removes what the controller made for it
    kube.custom.delete_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, "gang"
    )
    wait_for(
        "the agents' ServiceAccount and RoleBinding garbage-collected",
        lambda: (
            or_none(rbac.read_namespaced_role_binding, AGENT_BINDING, namespace) is None
            and or_none(read_account, AGENT_SERVICE_ACCOUNT, namespace) is None
        ),
        120,
    )
    assert or_none(read_account, ACCOUNT, namespace) is not None, "the user's own stays"


def test_the_first_pods_of_a_namespace_are_never_refused_for_want_of_the_agents_account(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str
) -> None:
    """Its pods run as the agents' account (they name none), which the admission of the
    JobSet makes: the Job controller's first pod creations are not refused ("error looking
    up service account"), and the keeper then makes the JobSet its owner."""
    read_account = kube.core.read_namespaced_service_account
    assert or_none(read_account, AGENT_SERVICE_ACCOUNT, namespace) is None
    training_gang(kube, cluster_kubeconfig, namespace, "gang", MEMBERS)
    refused = [
        f"{e.involved_object.name}: {e.message}"
        for e in kube.core.list_namespaced_event(namespace).items
        if e.reason == "FailedCreate" and "service account" in (e.message or "")
    ]
    assert refused == []
    js = kube.custom.get_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, "gang"
    )
    wait_for(
        "the keeper's owner on the account made at admission",
        lambda: (
            [
                o.uid
                for o in read_account(AGENT_SERVICE_ACCOUNT, namespace).metadata.owner_references
                or []
            ]
            == [js["metadata"]["uid"]]
        ),
        60,
    )
