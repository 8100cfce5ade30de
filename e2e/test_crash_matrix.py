"""A real PyTorch trainer's crashes, each recovered once, every rank at one step, nothing of
the crashed epoch left (testbed/crashes.py says how each is made and checked). CI runs the
cases below; the whole matrix (every crash in every restart scope, with its times) is
``make bench-crashes`` (bench/crash_matrix.py, docs/benchmarks.md).

* ``prestart``/``oom``: a worker forked from the pre-started ``torchrun`` allocates past its
  container's memory limit and the kernel's OOM killer SIGKILLs it (the process holding the
  memory, not its stand-in): its stand-in must end as it did, never run the trainer itself;
* ``pod``/``abort``: a worker ends by SIGABRT, as NCCL's watchdog ends one, and the whole pod
  restarts in place.

Reads the containers' processes from this host's /proc: the local cluster's real nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.marks import KUBE_RELEASE
from testbed.controller import prepare
from testbed.crashes import CrashRunner
from testbed.install import Installation
from testbed.kube import Clients

pytestmark = pytest.mark.e2e

CI_CASES = [("prestart", "oom"), pytest.param("pod", "abort", marks=KUBE_RELEASE)]


@pytest.mark.parametrize(("scope", "crash"), CI_CASES)
def test_a_crash_is_recovered_once_at_one_step_with_nothing_old_left(
    scope: str,
    crash: str,
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    torch_site: Path,
) -> None:
    prepare(kube, cluster_kubeconfig, namespace)
    runner = CrashRunner(kube, namespace, cluster_kubeconfig, torch_site, print)
    result = runner.run(scope, crash, f"crash-{scope}-{crash}")
    assert result.passed, result
    print(
        f"\n{scope}/{crash}: every rank's first productive step {result.first_step:.2f} s after "
        f"the crash, resumed at {result.gang_resume_step}, causes {result.causes}"
    )
