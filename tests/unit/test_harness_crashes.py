"""The crash matrix's reading of a trainer container's processes (testbed/crashes.py): which
are the running epoch's (torchrun, its workers, stand-ins and forker; never the pre-started
standby) and which one each crash kills, in every restart scope's process shape."""

from __future__ import annotations

import argparse

import pytest

from bench.crash_matrix import parse_cases
from jobset_inplace.prestart import FORKER_NAME, STAND_IN_NAME
from testbed.crashes import BY_NAME, CRASHES, SCOPES, Proc, cases, epoch_tree, target
from testbed.torchgang import TRAINER

TORCHRUN = ("python3", "-m", "torch.distributed.run", "--nnodes=2", f"/trainer/{TRAINER}")
WORKER = ("/usr/bin/python3", "-u", f"/trainer/{TRAINER}")
LAUNCHER = ("python3", "/var/run/jobset-inplace/launcher.py", "--", *TORCHRUN)


def table(*procs: Proc) -> dict[int, Proc]:
    return {p.pid: p for p in procs}


COLD = table(
    Proc(100, 1, "python3", LAUNCHER, True),
    Proc(101, 100, "python3", TORCHRUN, False),
    Proc(102, 101, "python3", WORKER, False),
    Proc(103, 101, "python3", WORKER, False),
)
PRESTART = table(
    Proc(200, 1, "python3", LAUNCHER, True),
    Proc(201, 200, "python3", TORCHRUN, False),  # the running epoch's torchrun
    Proc(202, 201, FORKER_NAME, TORCHRUN, False),
    Proc(203, 201, STAND_IN_NAME, WORKER, False),
    Proc(204, 201, STAND_IN_NAME, WORKER, False),
    Proc(205, 202, "python3", TORCHRUN, False),  # forked workers: torchrun's command line
    Proc(206, 202, "python3", TORCHRUN, False),
    Proc(210, 200, "python3", TORCHRUN, False),  # the next epoch's, held
    Proc(211, 210, FORKER_NAME, TORCHRUN, False),
)
POD = table(  # torchrun is the container's first process
    Proc(300, 9, "python3", TORCHRUN, True),
    Proc(301, 300, "python3", WORKER, False),
    Proc(302, 300, "python3", WORKER, False),
)
AGENT = table(Proc(400, 9, "python3", ("python3", "-m", "jobset_inplace.agent"), True))


def test_the_running_epoch_is_torchrun_and_everything_under_it_not_the_standby() -> None:
    assert epoch_tree(COLD) == {101, 102, 103}
    assert epoch_tree(PRESTART) == {201, 202, 203, 204, 205, 206}
    assert epoch_tree(POD) == {300, 301, 302}
    assert epoch_tree(table(*(p for p in PRESTART.values() if p.pid >= 210))) == set()


@pytest.mark.parametrize(
    ("procs", "kills", "pid"),
    [
        (COLD, "worker", 102),
        (PRESTART, "worker", 205),  # the forked process that holds the memory, not its stand-in
        (PRESTART, "stand-in", 203),
        (COLD, "torchrun", 101),
        (PRESTART, "torchrun", 201),
        (POD, "torchrun", 300),
        (COLD, "launcher", 100),
        (PRESTART, "launcher", 200),
        (POD, "agent", 400),
    ],
)
def test_each_crash_kills_the_process_it_names(
    procs: dict[int, Proc], kills: str, pid: int
) -> None:
    assert target(kills, procs, AGENT) == pid


def test_a_process_that_is_not_there_is_an_error_not_a_guess() -> None:
    with pytest.raises(RuntimeError, match="no stand-in process found"):
        target("stand-in", COLD, AGENT)
    with pytest.raises(ValueError, match="no such process"):
        target("kubelet", COLD, AGENT)


def test_every_crash_is_made_one_way_in_the_scopes_that_have_it() -> None:
    assert all((c.fault is None) != (c.kills is None) for c in CRASHES)
    assert all(set(c.scopes) <= set(SCOPES) for c in CRASHES)
    assert ("pod", "launcher-sigkill") not in cases(), "no launcher in the pod scope"
    assert ("prestart", "stand-in-sigkill") in cases()
    assert len(cases()) == sum(len(c.scopes) for c in CRASHES)
    assert BY_NAME["oom"].fault == "oom"
    # an early crash is one of the pre-started path (the others have no standby to be early for)
    assert [c.name for c in CRASHES if c.early] == ["worker-sigkill-early"]
    assert BY_NAME["worker-sigkill-early"].scopes == ("prestart",)


def test_the_matrix_takes_only_cases_that_exist_and_says_which_do() -> None:
    assert parse_cases("prestart/oom, pod/segv") == [("prestart", "oom"), ("pod", "segv")]
    with pytest.raises(argparse.ArgumentTypeError, match="'pod/launcher-sigkill' is not a case"):
        parse_cases("pod/launcher-sigkill")  # no launcher in the pod scope
    with pytest.raises(argparse.ArgumentTypeError, match="accepted: process/worker-sigkill"):
        parse_cases("oom")
