"""The release's pure parts (release/artifacts.py): one version said everywhere, images pinned
by digest in install.yaml and the chart's values, arguments checked by name."""

from __future__ import annotations

import io
import json
import re
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobset_inplace import __version__
from release import artifacts, plugin, plugin_dist

RUNBOOKS = artifacts.REPO_ROOT / "docs" / "runbooks.md"
PROMETHEUS = artifacts.PROMETHEUS

DIGESTS = {"controller": "sha256:" + "c" * 64, "agent": "sha256:" + "a" * 64}


def test_the_tree_says_one_version_everywhere() -> None:
    assert artifacts.version_mismatches(__version__) == []


def test_another_version_names_every_place_that_says_otherwise() -> None:
    wrong = artifacts.version_mismatches("9.9.9")
    assert len(wrong) == 5, wrong
    assert any("Chart.yaml appVersion" in w for w in wrong)
    assert any("JSI_AGENT_IMAGE tag" in w for w in wrong)
    assert all(repr(__version__) in w for w in wrong)


def _base() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(artifacts.DEPLOYMENT.read_text()) if d]


def test_install_pins_the_controller_and_the_agent_it_injects() -> None:
    refs = artifacts.pinned("registry.example/jsi", "1.2.3", DIGESTS)
    objects = artifacts.pin_install(_base(), refs)
    (deploy,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"registry.example/jsi/controller:1.2.3@{DIGESTS['controller']}"
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["JSI_AGENT_IMAGE"] == f"registry.example/jsi/agent:1.2.3@{DIGESTS['agent']}"
    assert _base()[1]["spec"] != deploy["spec"], "the input is not changed"


def test_install_without_the_agent_image_setting_is_refused() -> None:
    objects = _base()
    (container,) = objects[1]["spec"]["template"]["spec"]["containers"]
    container["env"] = [e for e in container["env"] if e["name"] != "JSI_AGENT_IMAGE"]
    with pytest.raises(ValueError, match="JSI_AGENT_IMAGE"):
        artifacts.pin_install(objects, artifacts.pinned("r", "1.2.3", DIGESTS))


def test_chart_values_are_pinned_with_their_comments_kept() -> None:
    text = (artifacts.CHART / "values.yaml").read_text()
    out = artifacts.pin_values(text, "registry.example/jsi", DIGESTS)
    values = yaml.safe_load(out)
    assert values["image"]["repository"] == "registry.example/jsi/controller"
    assert values["image"]["digest"] == DIGESTS["controller"]
    assert values["agentImage"]["repository"] == "registry.example/jsi/agent"
    assert values["agentImage"]["digest"] == DIGESTS["agent"]
    assert out.count("#") == text.count("#")
    assert len(out.splitlines()) == len(text.splitlines())


def test_chart_values_without_a_digest_field_are_refused() -> None:
    text = "image:\n  repository: x/controller\n  tag: ''\nagentImage:\n  repository: x/agent\n"
    with pytest.raises(ValueError, match=r"image\.digest"):
        artifacts.pin_values(text, "r", DIGESTS)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["controller=sha256:abc"], "KEY=sha256:<64 hex digits>"),
        (["server=" + DIGESTS["agent"]], "controller, agent"),
        (["controller=" + DIGESTS["controller"]], "one for each"),
    ],
)
def test_bad_digests_are_refused_by_form(given: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        artifacts.parse_digests(given)


def test_digests_given_for_both_images() -> None:
    given = [f"{k}={v}" for k, v in DIGESTS.items()]
    assert artifacts.parse_digests(given) == DIGESTS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--version", "v1.0.0"], "--version: X.Y.Z"),
        (["--version", "1.0"], "--version: X.Y.Z"),
        (["--plugin-base-url", "http://example.invalid/"], "--plugin-base-url: an https://"),
        (["--runbook-base-url", "docs/runbooks.md"], "--runbook-base-url: an https://"),
        (["--registry", "Registry.example/JSI"], "--registry"),
        (["--registry", "registry.example/jsi:1.0"], "--registry"),
        (["--version", "9.9.9"], "not at version 9.9.9"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = {
        "--version": __version__,
        "--registry": "registry.example/jsi",
        "--plugin-base-url": "https://example.invalid/download",
        "--runbook-base-url": "https://docs.example/runbooks.md",
    }
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    argv = [x for kv in base.items() for x in kv] + ["--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        artifacts.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_an_oci_archives_digest_is_its_one_manifests(tmp_path: Path) -> None:
    index = {"schemaVersion": 2, "manifests": [{"digest": DIGESTS["agent"], "size": 1}]}
    data = json.dumps(index).encode()
    archive = tmp_path / "image.oci.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("index.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert artifacts.oci_digest(archive) == DIGESTS["agent"]


def test_the_plugins_cache_key_follows_every_source_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cached executable is reused only for the same inputs: a changed or added file of
    the package is a new key; its __pycache__ is not an input."""
    package = tmp_path / "jobset_inplace"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("A = 1\n")
    monkeypatch.setattr(plugin, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(plugin, "PACKAGE", package)
    entry = tmp_path / "entry.py"
    entry.write_text("main()\n")
    monkeypatch.setattr(plugin, "ENTRY", entry)
    keys = [plugin.inputs_key()]
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert plugin.inputs_key() == keys[0]
    (package / "a.py").write_text("A = 2\n")
    keys.append(plugin.inputs_key())
    (package / "sub" / "b.py").write_text("")
    keys.append(plugin.inputs_key())
    entry.write_text("main(1)\n")
    keys.append(plugin.inputs_key())
    assert len(set(keys)) == len(keys)


def test_every_alert_of_the_release_links_its_runbook_at_the_url_given() -> None:
    """prometheus.yaml's links resolve outside the repository: each alert's runbook_url is
    the published runbooks page's anchor for it (docs/runbooks.md has one per alert)."""
    rules = [
        {"alert": "JobsetInplaceNoLeader", "annotations": {"runbook_url": "docs/runbooks.md#x"}},
        {"record": "jobset_inplace:something"},
    ]
    objects: list[dict[str, Any]] = [
        {"kind": "PodMonitor", "spec": {}},
        {"kind": "PrometheusRule", "spec": {"groups": [{"name": "g", "rules": rules}]}},
    ]
    out = artifacts.with_runbooks(objects, "https://docs.example/runbooks.md/")
    (alert, record) = out[1]["spec"]["groups"][0]["rules"]
    assert alert["annotations"]["runbook_url"] == (
        "https://docs.example/runbooks.md#jobsetinplacenoleader"
    )
    assert "annotations" not in record
    assert objects[1]["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"] == (
        "docs/runbooks.md#x"
    ), "the objects given are not changed"
    anchors = set(re.findall(r"^## (\w+)$", RUNBOOKS.read_text(), re.MULTILINE))
    shipped = yaml.safe_load((PROMETHEUS / "prometheusrule.yaml").read_text())
    alerts = {r["alert"] for g in shipped["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {a.lower() for a in alerts} <= {a.lower() for a in anchors}, "a runbook per alert"


def test_the_plugins_own_distribution_holds_the_plugin_and_what_it_imports_only() -> None:
    """release/plugin_dist.py: the plugin's files and the pure modules they import, none of the
    controller's, the agent's or the webhook server's; its requirements are those imports'."""
    files, external = plugin_dist.closure()
    shown = {str(f.relative_to(plugin_dist.REPO_ROOT)) for f in files}
    assert "jobset_inplace/kubectl_plugin/cli.py" in shown
    assert "jobset_inplace/core/transform.py" in shown, "enable runs the webhook's transform"
    for adapter in ("controller", "agent", "runtime"):
        assert not {f for f in shown if f.startswith(f"jobset_inplace/{adapter}/")}, adapter
    project = tomllib.loads(plugin_dist.pyproject_text(external))["project"]
    assert project["requires-python"] == ">=3.9"
    assert sorted(d.split(">")[0] for d in project["dependencies"]) == [
        "jsonpatch", "kubernetes", "pyyaml"
    ]  # fmt: skip
    assert set(project["scripts"]) == {"kubectl-jobset_inplace", "kubectl_complete-jobset_inplace"}
    with pytest.raises(SystemExit, match=r"imports \['kopf'\]: name its distribution"):
        plugin_dist.pyproject_text(external | {"kopf"})
