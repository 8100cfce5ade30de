"""e2e fixtures. The suite runs against ``JSI_KUBECONFIG`` when set (any cluster with JobSet
and Kueue installed), otherwise against the local cluster, which it brings up if needed
(idempotent) and takes down afterwards only if it created it (``JSI_KEEP_CLUSTER=1`` keeps it).

Every e2e test runs on the local cluster. On another cluster, the tests that need one of its
levers (the controller installed from the locally built images on its real kubelet nodes, kwok
nodes whose heartbeat a test stops) skip with that reason.
A skipped e2e test is not a pass: the run lists each one with its reason at the end and exits
non-zero, unless ``JSI_E2E_PARTIAL=1`` accepts a partial run."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from jobset_inplace import names
from testbed import images
from testbed.cluster import DEFAULT_NODES, DEFAULT_REAL_NODES, LocalCluster, log
from testbed.controller import namespace_state, prepare
from testbed.images import IMAGES_LOADED_ENV
from testbed.install import Installation
from testbed.kube import Clients, clients, remove_taint, temporary_namespace, wait_for
from testbed.kwoknodes import NODE_DOWN_TAINTS, kwok_nodes, set_heartbeat, silenced, unhealthy
from testbed.torchgang import create_trainer_config_map


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster | None]:
    if os.environ.get("JSI_KUBECONFIG"):
        yield None
        return
    cluster = LocalCluster(os.environ.get("JSI_CLUSTER_NAME", "jsi"))
    created = not cluster.is_up()
    cluster.up(
        int(os.environ.get("JSI_NODES", DEFAULT_NODES)),
        int(os.environ.get("JSI_REAL_NODES", DEFAULT_REAL_NODES)),
    )
    try:
        yield cluster
    finally:
        if created and not os.environ.get("JSI_KEEP_CLUSTER"):
            cluster.down()


@pytest.fixture
def kwok_cluster(local_cluster: LocalCluster | None) -> LocalCluster:
    """The local cluster, for tests that make its simulated (kwok) nodes fail."""
    if local_cluster is None:
        pytest.skip("makes kwok nodes fail: the local cluster's simulated nodes")
    return local_cluster


# A revived kwok node is Ready again once kwok has taken its Lease back (its next try, ~10 s) and
# the node lifecycle controller has seen it (node-monitor-period) and lifted its taints.
KWOK_NODE_REVIVAL_SECONDS = 120
# ... and the controller's leader lifts its unhealthy taint as soon as it sees the node back.
TAINT_LIFT_SECONDS = 30


@pytest.fixture
def healthy_kwok_nodes(kwok_cluster: LocalCluster, kube: Clients) -> Iterator[list[str]]:
    """The kwok nodes' names, every one of them healthy before the test and again after it,
    whatever it did: a node left silenced, not Ready or tainted would fail or skew later tests
    (in any order). For tests that make kwok nodes fail."""
    heal_kwok_nodes(kube)
    yield kwok_nodes(kube)
    heal_kwok_nodes(kube)


def heal_kwok_nodes(kube: Clients) -> None:
    """Revive every silenced kwok node and wait until all are Ready, without the node lifecycle
    controller's taints and without the controller's unhealthy taint. Only a running leader
    lifts that one; with none (uninstalled, or broken by the test) it goes here after a bounded
    wait. Before a test too: an interrupted run can leave a node silenced."""
    for node in silenced(kube):
        set_heartbeat(kube, node, alive=True)
    _wait_kwok_nodes(kube, NODE_DOWN_TAINTS, "every kwok node Ready", KWOK_NODE_REVIVAL_SECONDS)
    ours = (names.UNHEALTHY_TAINT,)
    try:
        _wait_kwok_nodes(
            kube, ours, f"{names.UNHEALTHY_TAINT} lifted by the controller", TAINT_LIFT_SECONDS
        )
    except AssertionError as e:
        log(f"{e}: removing it")
        for node in unhealthy(kube, ours):
            remove_taint(kube, node, names.UNHEALTHY_TAINT)


def _wait_kwok_nodes(kube: Clients, taints: tuple[str, ...], what: str, timeout: float) -> None:
    """Wait until every kwok node is Ready without ``taints``; on timeout say what is wrong."""
    try:
        wait_for(what, lambda: not unhealthy(kube, taints), timeout, 1)
    except AssertionError as e:
        raise AssertionError(f"{e}; still: {unhealthy(kube, taints)}") from None


@pytest.fixture(scope="session")
def cluster_kubeconfig(local_cluster: LocalCluster | None) -> Path:
    return local_cluster.kubeconfig if local_cluster else Path(os.environ["JSI_KUBECONFIG"])


@pytest.fixture(scope="session")
def kube(cluster_kubeconfig: Path) -> Clients:
    return clients(cluster_kubeconfig)


@pytest.fixture
def namespace(kube: Clients, request: pytest.FixtureRequest) -> Iterator[str]:
    with temporary_namespace(kube, request.node.name) as ns:
        yield ns


@pytest.fixture(scope="session")
def torch_site(local_cluster: LocalCluster | None) -> Path:
    """PyTorch installed on this host (testbed/images.py), mounted into the real nodes' pods."""
    if local_cluster is None:
        pytest.skip("mounts PyTorch from this host into the local cluster's real nodes")
    return images.torch_site()


@pytest.fixture
def controller(installation: Installation) -> Installation:
    """The session's install, settled before the test (:meth:`Installation.wait_settled`):
    every replica ready and one leading. A test before may have taken a replica's node away
    (the Deployment's new pod runs a while before it is ready) or scaled the controller: the
    next test starts from the install users have, not from that test's aftermath."""
    installation.wait_settled(installation.replicas())
    return installation


@pytest.fixture(scope="session")
def installation(
    local_cluster: LocalCluster | None, cluster_kubeconfig: Path
) -> Iterator[Installation]:
    """jobset-inplace installed in the cluster as users install it (``kubectl apply -k``; 2
    replicas, leader election, self-managed webhook TLS), for the session; uninstalled
    afterwards. On the local cluster the locally built images are imported into its real nodes
    first; another cluster qualifies when its nodes have the images already
    (``JSI_E2E_IMAGES_LOADED=1``: testbed/kind/run.sh loads them into kind)."""
    if local_cluster is None and os.environ.get(IMAGES_LOADED_ENV) != "1":
        pytest.skip(
            "installs the locally built images: the local cluster's real nodes, or a cluster"
            f" whose nodes have them ({IMAGES_LOADED_ENV}=1, testbed/kind/run.sh)"
        )
    installation = Installation(cluster_kubeconfig, local_cluster)
    installation.install()
    yield installation
    installation.uninstall()


@pytest.fixture(scope="session")
def pytorch_examples_image(local_cluster: LocalCluster | None) -> str:
    """The PyTorch examples' image (``make images EXAMPLES=1``), built here (minutes the first
    time: PyTorch's CUDA build) and imported into the local cluster's real nodes."""
    if local_cluster is None:
        pytest.skip("builds its image (several GB) into the local cluster's real nodes")
    sockets = [str(images.node_socket(n)) for n in local_cluster.real_nodes()]
    return images.build_pytorch_examples_image(imports=sockets).name


@pytest.fixture(scope="session")
def jax_examples_image(local_cluster: LocalCluster | None) -> str:
    """The JAX examples' image (``make images EXAMPLES=1``), built here and imported into the
    local cluster's real nodes."""
    if local_cluster is None:
        pytest.skip("builds its image into the local cluster's real nodes")
    sockets = [str(images.node_socket(n)) for n in local_cluster.real_nodes()]
    return images.build_jax_examples_image(imports=sockets).name


@pytest.fixture
def torch_trainer(
    controller: Installation, kube: Clients, cluster_kubeconfig: Path, namespace: str
) -> None:
    """The test's namespace ready for a PyTorch gang (testbed/torchgang.py): prepared for
    jobset-inplace's agents (the controller installed) and holding the trainer's ConfigMap."""
    prepare(kube, cluster_kubeconfig, namespace)
    create_trainer_config_map(kube, namespace)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test that used the in-cluster controller reports its pods' logs (the lines
    about the test's namespace, when it has one), and its namespace's state."""
    report: pytest.TestReport = yield
    if not (report.failed and call.when == "call"):
        return report
    args = getattr(item, "funcargs", {})
    installation, ns, kube = args.get("controller"), args.get("namespace"), args.get("kube")
    if isinstance(installation, Installation):
        about = ns if isinstance(ns, str) else None
        try:
            logs = installation.logs(about=about)
        except Exception as e:  # the report must not hide the failure behind another one
            logs = f"(could not read the controller logs: {e})"
        report.sections.append(("controller pods' logs", logs))
    if isinstance(ns, str) and isinstance(kube, Clients):
        try:
            state = namespace_state(kube, ns)
        except Exception as e:
            state = f"(could not read the namespace: {e})"
        report.sections.append((f"namespace {ns}", state))
    return report


# --- a partial run is not a pass ---------------------------------------------------------------
PARTIAL_ENV = "JSI_E2E_PARTIAL"
E2E_DIR = Path(__file__).resolve().parent


class PartialRunCheck:
    """Lists the e2e tests that were skipped, with their reasons, at the end of the run; any
    skipped e2e test makes the run fail unless ``JSI_E2E_PARTIAL=1``. Only e2e tests count
    (``make test`` runs every tier in one pytest session)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.selected: list[str] = []
        self.skipped: dict[str, str] = {}

    def in_e2e(self, nodeid: str) -> bool:
        path = (self.config.rootpath / nodeid.split("::", 1)[0]).resolve()
        return path.is_relative_to(E2E_DIR)

    @property
    def accepted(self) -> bool:
        return os.environ.get(PARTIAL_ENV) == "1"

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected = [item.nodeid for item in session.items if self.in_e2e(item.nodeid)]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail") and self.in_e2e(report.nodeid):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.skipped[report.nodeid] = reason.removeprefix("Skipped: ")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.skipped and not self.accepted and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.selected or self.config.option.collectonly:
            return
        where = os.environ.get("JSI_KUBECONFIG")
        cluster = f"the cluster of JSI_KUBECONFIG={where}" if where else "the local cluster"
        tr, n, skipped = terminalreporter, len(self.selected), self.skipped
        if not skipped:
            tr.write_line(f"e2e on {cluster}: no test skipped ({n} selected)")
            return
        tr.write_sep("=", f"e2e: {len(skipped)} of {n} selected tests did not run", red=True)
        tr.write_line(f"on {cluster}:")
        for nodeid, reason in skipped.items():
            tr.write_line(f"  SKIPPED {nodeid}")
            tr.write_line(f"          {reason}")
        if self.accepted:
            tr.write_line(
                f"{PARTIAL_ENV}=1: a partial run is accepted; the exit status ignores them"
            )
        else:
            tr.write_line(
                f"a partial run is a failure (exit status 1 if nothing else failed); "
                f"{PARTIAL_ENV}=1 accepts it. docs/testing.md says what runs where.",
                red=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(PartialRunCheck(config), "jsi-e2e-partial-run")
