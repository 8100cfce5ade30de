"""The first-productive-step benchmark's reading of the ranks' logs and its per-path JobSets."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import first_step, upstream
from bench.first_step import Recovery, torch_path_jobset
from jobset_inplace import names
from jobset_inplace.core.admission import validate, warnings
from jobset_inplace.core.transform import AgentSettings, transform
from testbed.torchgang import (
    LINEAR,
    TORCHRUN_OWN_STORES,
    TRANSFORMER,
    last_step_before,
    master,
    rank_resumes,
    released_pid,
    torch_jobset,
    warm_held,
)

CRASH = 100.0


def _lines(*pairs: tuple[float, str]) -> list[tuple[float, str]]:
    return list(pairs)


def test_milestones_are_those_of_the_run_that_resumed() -> None:
    lines = _lines(
        (99.0, "[rank 0] step 43 loss 1.0e-01"),
        (100.5, "[rank 0] step 44 loss 1.0e-01"),  # the old run, after the crash
        (101.0, "[rank 0] process started"),  # a start that failed (rendezvous) ...
        (102.0, "[rank 0] imported torch"),
        (103.0, "[rank 0] process started"),  # ... and the retry
        (104.0, "[rank 0] imported torch"),
        (105.0, "[rank 0] process group ready"),
        (105.5, "[rank 0] model built: transformer, 109681152 parameters"),
        (106.0, "[rank 0] resumed at step 40 loss 2.0e-01"),
        (107.0, "[rank 0] step 41 loss 2.0e-01"),
        (108.0, "[rank 0] step 42 loss 2.0e-01"),
    )
    (r,) = rank_resumes(lines, CRASH).values()
    assert (r.started, r.imported, r.group_ready, r.built) == (103.0, 104.0, 105.0, 105.5)
    assert (r.restored, r.resume_step, r.first_step) == (106.0, 40, 107.0)


def test_a_rank_not_back_yet_has_no_first_step() -> None:
    lines = _lines(
        (101.0, "[rank 1] process started"),
        (102.0, "[rank 1] resumed at step 40 loss 2.0e-01"),
        (99.0, "[rank 2] resumed at step 40 loss 2.0e-01"),  # before the crash: not this one
    )
    got = rank_resumes(lines, CRASH)
    assert set(got) == {1}
    assert got[1].first_step is None


def test_two_ranks_in_one_line_are_both_read() -> None:
    line = "[rank 0] step 41 loss 1.0e-01[rank 1] step 44 loss 1.0e-01"
    assert last_step_before([(99.0, line), (101.0, "[rank 0] step 45 loss 1.0e-01")], CRASH) == 44


def test_each_path_runs_the_same_trainer(tmp_path: Path) -> None:
    site = tmp_path / "site"
    jsi = torch_path_jobset("jsi-pod", "p", tmp_path, site)
    assert jsi["metadata"]["annotations"][names.RESTART_SCOPE] == "pod"
    assert jsi["metadata"]["annotations"][names.CHECKPOINT_LAYOUT] == "torch-dcp"

    def pod(js: dict[str, Any]) -> dict[str, Any]:
        spec: dict[str, Any] = js["spec"]["replicatedJobs"][0]["template"]["spec"]
        return spec["template"]["spec"]  # type: ignore[no-any-return]

    pre = torch_path_jobset("jsi-prestart", "q", tmp_path, site)["metadata"]["annotations"]
    assert pre[names.RESTART_SCOPE] == "process"
    assert pre[names.PRESTART_IMPORTS].startswith("torch")

    stock = torch_path_jobset("stock-grace0", "s", tmp_path, site)
    assert stock["metadata"]["annotations"] == {}, "stock: not opted in"
    assert pod(stock)["terminationGracePeriodSeconds"] == 0
    assert stock["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] == 0
    command = pod(stock)["containers"][0]["command"]
    assert command == pod(torch_jobset(tmp_path, site, name="s"))["containers"][0]["command"]
    assert f"--master-addr={master('s')}" in command
    main = torch_path_jobset("upstream-main", "u", tmp_path, site)
    trainer = pod(main)["containers"][0]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert "torch.distributed.run" in env["WORKER_COMMAND"]
    assert main["spec"]["failurePolicy"]["restartStrategy"] == "InPlaceRestart"
    assert pod(main)["serviceAccountName"] == upstream.SERVICE_ACCOUNT
    # torchrun's own restarts: stock JobSet, a c10d rendezvous member 0's torchrun hosts
    own = torch_path_jobset("torchrun-restarts", "t", tmp_path, site)
    assert own["metadata"]["annotations"] == {}
    sh, flag, script, *argv = pod(own)["containers"][0]["command"]
    assert (sh, flag, argv[:3]) == ("sh", "-c", ["python3", "-m", "torch.distributed.run"])
    assert f"--max-restarts={first_step.TORCHRUN_RESTARTS}" in argv
    assert f"--rdzv-endpoint={master('t')}:29500" in argv
    assert "--rdzv-backend=c10d" in argv
    assert not any(a.startswith(("--node-rank", "--master-addr")) for a in argv)
    own_env = {e["name"]: e.get("value") for e in pod(own)["containers"][0]["env"]}
    assert own_env[TORCHRUN_OWN_STORES] == "1", "workers' stores of their own (torchgang.py)"
    assert TORCHRUN_OWN_STORES not in {e["name"] for e in pod(stock)["containers"][0]["env"]}
    hosts = {}
    for rank in ("0", "1"):  # the shell gives torchrun is_host=1 on member 0 only
        run = subprocess.run(
            ["sh", "-c", script.replace('exec "$0"', 'echo "$0"'), "python3", *argv],
            env={"NODE_RANK": rank, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        )
        words = run.stdout.split()
        hosts[rank] = [w for w in words if w.startswith("--rdzv-conf=")]
        assert words[-1] == "/trainer/torch_dcp_trainer.py", "the script comes last"
    assert hosts == {"0": ["--rdzv-conf=is_host=1"], "1": ["--rdzv-conf=is_host=0"]}
    # the PyTorch site and the trainer are mounted on every path
    for js in (jsi, stock, main, own):
        mounts = {m["mountPath"] for m in pod(js)["containers"][0]["volumeMounts"]}
        assert {"/ckpt", "/opt/torch", "/trainer"} <= mounts


def _recovery(path: str, first: float, lost: int, consistent: bool = True) -> Recovery:
    at = dict.fromkeys(first_step.MILESTONES, None) | {"barrier": 1.0, "first_step": first}
    return Recovery(path, 0, at, {0: 40}, None, consistent, 40 + lost, lost)


def test_summary_and_table_give_ratios_and_flag_an_inconsistent_path() -> None:
    runs = [
        _recovery("jsi-process", 4.0, 3),
        _recovery("jsi-process", 6.0, 5),
        _recovery("upstream-main", 20.0, 4),
        _recovery("stock", 40.0, 9, consistent=False),
    ]
    s = first_step.summary(runs, ("jsi-process", "upstream-main", "stock"))
    assert s["jsi-process"]["median"]["first_step"] == 5.0
    assert s["jsi-process"]["steps_lost_median"] == 4
    assert s["jsi-process"]["intervals"]["first_step"] == [4.0, 6.0]
    assert "first_step" not in s["stock"]["intervals"]  # one repetition: no interval
    text = first_step.table(s)
    assert "| jsi-process | 2 | " in text
    assert "0.25x" in text  # jsi-process: 5 s / upstream-main's 20 s
    assert "**no**" in text.splitlines()[-3]  # the last row, before the note


def test_the_real_size_model_runs_one_worker_a_pod_on_every_path(tmp_path: Path) -> None:
    for path in first_step.PATHS:
        js = torch_path_jobset(path, "m", tmp_path, tmp_path / "site", TRANSFORMER)
        pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        trainer = pod["containers"][0]
        argv = " ".join(trainer["command"])
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        argv = env.get("WORKER_COMMAND", argv)  # upstream-main: its agent runs torchrun
        if path == "jsi-warm":  # the trainer itself, one a pod, its identity torchrun's would be
            assert argv == "python3 -u /trainer/torch_dcp_trainer.py"
            assert (env["WORLD_SIZE"], env["LOCAL_RANK"], env["WARM"]) == ("2", "0", "1")
        else:
            assert "--nproc-per-node=1" in argv, path
        assert (env["MODEL"], env["SAVE_EVERY"], env["STEP_SECONDS"]) == ("transformer", "5", "0")
    assert TRANSFORMER.ranks == 2


def test_the_warm_gang_is_one_the_webhook_takes_and_needs_one_worker_a_pod(tmp_path: Path) -> None:
    js = torch_path_jobset("jsi-warm", "m", tmp_path, tmp_path / "site", TRANSFORMER)
    assert validate(js) == (True, "")
    out = transform(js, AgentSettings(image="jobset-inplace/python:local"))
    trainer = out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e for e in trainer["env"]}
    assert env["JSI_PRESTART_WARM"]["value"] == "1"
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"].endswith("job-index']")
    with pytest.raises(ValueError, match="one worker a pod"):
        torch_path_jobset("jsi-warm", "m", tmp_path, tmp_path / "site", LINEAR)


def test_the_victim_of_a_warm_gang_is_the_released_trainer_not_its_standby() -> None:
    log = (
        "launcher: epoch 1: released pre-started pid 7 (resume step None)\n"
        "standby[9]: warm: held at step None\n"
        "launcher: epoch 2: released pre-started pid 9 (resume step 10)\n"
    )
    assert released_pid(log) == 9
    cold = "launcher: epoch 3: started python3 -u t.py (pid 12, resume step 10)\n"
    assert released_pid(log + cold) == 12, "a later epoch started cold"
    assert released_pid(cold + log) == 9
    assert released_pid("launcher: pre-started python3 t.py (pid 7): held") is None
    assert not warm_held("standby[9]: warm: held at step None")
    assert warm_held(log + "standby[11]: warm: held at step 10 (loaded in 4.10 s)")


def test_each_paths_ratio_to_the_prestarted_scope_has_an_interval() -> None:
    runs = [_recovery("jsi-prestart", t, 3) for t in (5.0, 6.0, 7.0)]
    runs += [_recovery("torchrun-restarts", t, 3) for t in (10.0, 12.0, 14.0)]
    runs += [_recovery("stock", 30.0, 3)]  # one recovery: no interval
    s = first_step.summary(runs, ("jsi-prestart", "torchrun-restarts", "stock"))
    r = s["torchrun-restarts"]["prestart_ratio"]
    assert r["ratio"] == 0.5
    assert r["low"] <= 0.5 <= r["high"]
    assert (r["n_a"], r["n_b"]) == (3, 3)
    assert s["stock"]["prestart_ratio"] is None
    assert s["jsi-prestart"]["prestart_ratio"] is None
    rows = first_step.table(s).splitlines()
    assert "0.50x (95% interval" in rows[3]
    assert "n = 3, 3" in rows[3]


def test_a_run_from_before_the_model_built_milestone_still_renders() -> None:
    s = first_step.summary([_recovery("jsi-process", 4.0, 3)], ("jsi-process",))
    del s["jsi-process"]["median"]["built"], s["jsi-process"]["prestart_ratio"]
    assert "| jsi-process |" in first_step.table(s)


def test_the_hot_spare_gang_is_admitted_and_gives_torchrun_no_rank_of_its_own(
    tmp_path: Path,
) -> None:
    """e2e/test_hot_spares.py's gang: the webhook neither refuses nor warns about it (no
    ``--node-rank``/``--master-addr``, no rank from the pod's labels: the launcher gives each
    epoch's torchrun its slot), and it names its spare; spares need the static rendezvous."""
    js = torch_jobset(tmp_path, tmp_path / "site", name="s", hot_spares=1)
    assert validate(js) == (True, "")
    assert warnings(js) == []
    assert js["metadata"]["annotations"][names.HOT_SPARES] == "1"
    trainer = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert not any(a.startswith(("--node-rank", "--master-addr")) for a in trainer["command"])
    assert "NODE_RANK" not in {e["name"] for e in trainer["env"]}
    with pytest.raises(ValueError, match="static rendezvous"):
        torch_jobset(tmp_path, tmp_path / "site", hot_spares=1, max_restarts=2)
