from __future__ import annotations

import os
import re
import subprocess

import pytest

from jobset_inplace.platform import (
    device_health_gates,
    device_taint_gates,
    device_taint_rule_version,
    device_taint_runtime_config,
    gates_flag,
    gates_needed,
)
from testbed.versions import (
    K8S_ENV,
    TESTBED_DIR,
    VERSIONS_FILE,
    local_module_version,
    parse_versions,
    versions,
)

SHELL_VERSIONS = VERSIONS_FILE.with_suffix(".sh")
FULL = (
    "K8S_DEFAULT=1.37\nKUBERNETES_1_37=v1.37.2\nKUBERNETES_1_35=v1.35.4\nETCD_VERSION=v2\n"
    "KWOK_VERSION=v3\nJOBSET_VERSION=v4\nKUEUE_VERSION=v5\nCONTAINERD_VERSION=v6\n"
    "RUNC_VERSION=v7\nHELM_VERSION=v8\nPROMETHEUS_VERSION=v9\nKREW_VERSION=v10\nACTIONLINT_VERSION=v11\n"
    "KIND_VERSION=v12\nCNI_PLUGINS_VERSION=v13\nCRICTL_VERSION=v14\n"
)


def test_pinned_versions_file_parses_to_semver_tags() -> None:
    for minor in ("", "1.35", "1.37"):
        v = parse_versions(VERSIONS_FILE.read_text(), minor)
        for value in vars(v).values():
            assert re.fullmatch(r"v\d+\.\d+\.\d+", value), value
    assert parse_versions(VERSIONS_FILE.read_text(), "1.35").kubernetes.startswith("v1.35.")


def test_k8s_selects_the_minor_and_defaults_to_k8s_default() -> None:
    assert parse_versions(FULL).kubernetes == "v1.37.2"
    assert parse_versions(FULL, "1.35").kubernetes == "v1.35.4"
    assert parse_versions(FULL, "1.35").feature_gates == (
        "RestartAllContainersOnContainerExits=true,NodeDeclaredFeatures=true,"
        "ResourceHealthStatus=true,DRADeviceTaints=true,DRADeviceTaintRules=true"
    )
    assert parse_versions(FULL, "1.35").runtime_config == "resource.k8s.io/v1alpha3=true"
    assert parse_versions(FULL).feature_gates == ""
    assert parse_versions(FULL).runtime_config == ""


def test_unsupported_minor_names_the_variable_and_the_accepted_ones() -> None:
    with pytest.raises(
        ValueError, match=r"K8S=1\.36: not a supported .* \(accepted: 1\.35 1\.37\)"
    ):
        parse_versions(FULL, "1.36")
    with pytest.raises(ValueError, match="K8S=latest"):
        parse_versions(FULL, "latest")


@pytest.mark.parametrize("minor", ["", "1.35", "1.37"])
def test_shell_and_python_resolve_the_same_kubernetes(minor: str) -> None:
    env = {**os.environ, K8S_ENV: minor}
    out = subprocess.run(
        [
            "bash",
            "-c",
            f'source "{VERSIONS_FILE.with_suffix(".sh")}" && echo "$KUBERNETES_VERSION"',
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == parse_versions(VERSIONS_FILE.read_text(), minor).kubernetes


def test_shell_refuses_an_unsupported_minor() -> None:
    res = subprocess.run(
        ["bash", "-c", f'set -e; source "{SHELL_VERSIONS}"; echo resolved'],
        env={**os.environ, K8S_ENV: "1.30"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 2
    assert "resolved" not in res.stdout
    assert "K8S=1.30: not a supported Kubernetes minor" in res.stderr


def test_missing_key_is_named() -> None:
    with pytest.raises(ValueError, match="missing RUNC_VERSION"):
        parse_versions(FULL.replace("RUNC_VERSION=v7\n", ""))


def test_malformed_line_is_quoted() -> None:
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_versions("KUBERNETES_VERSION v1.35.4\n")


def test_gates_needed_by_minor() -> None:
    assert device_health_gates(35) == ("ResourceHealthStatus",)
    assert device_health_gates(36) == device_health_gates(37) == ()
    assert gates_needed(35) == ("RestartAllContainersOnContainerExits", "NodeDeclaredFeatures")
    assert gates_needed(36) == ()
    assert gates_needed(37) == ()
    with pytest.raises(ValueError, match=r"needs 1\.35\+"):
        gates_needed(34)


def test_dra_device_taints_by_minor() -> None:
    """Read off kube_features.go and the resource.k8s.io registry of v1.35.4 and v1.37.2."""
    assert device_taint_gates(35) == ("DRADeviceTaints", "DRADeviceTaintRules")
    assert device_taint_gates(37) == ()
    assert [device_taint_rule_version(m) for m in (35, 36, 37)] == ["v1alpha3", "v1beta2", "v1"]
    assert device_taint_runtime_config(35) == "resource.k8s.io/v1alpha3=true"
    assert device_taint_runtime_config(37) == ""
    assert gates_flag(35, device_taints=True) == (
        "RestartAllContainersOnContainerExits=true,NodeDeclaredFeatures=true,"
        "DRADeviceTaints=true,DRADeviceTaintRules=true"
    )
    assert gates_flag(37, device_health=True, device_taints=True) == ""


def test_session_versions_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for minor, release in (("1.35", "v1.35."), ("", "v1.37.")):
        monkeypatch.setenv(K8S_ENV, minor)
        versions.cache_clear()
        assert versions().kubernetes.startswith(release)
    monkeypatch.undo()
    versions.cache_clear()  # the session's own value again


@pytest.mark.parametrize("module", ["deviceplugin", "coredns"])
def test_shell_and_python_key_the_local_module_builds_alike(module: str) -> None:
    """build-binaries.sh and testbed/versions.py must find the same cached binary."""
    out = subprocess.run(
        ["bash", "-c", "cat main.go go.mod go.sum | sha256sum | cut -c1-12"],
        cwd=TESTBED_DIR / module,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == local_module_version(module)
    script = (VERSIONS_FILE.parent / "build-binaries.sh").read_text()
    assert "cat main.go go.mod go.sum | sha256sum | cut -c1-12" in script
