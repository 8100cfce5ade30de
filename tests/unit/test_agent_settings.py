"""The injected agent's install-wide settings from the controller's environment: resources
and pull secrets checked as the apiserver would check the pod, with errors naming the
variable and the accepted form."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobset_inplace.controller.main import main
from jobset_inplace.core.agent_settings import (
    DEFAULT_RESOURCES,
    parse_pull_secrets,
    parse_resources,
    quantity,
)
from jobset_inplace.runtime.webhook_server import settings_from_env


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("10m", Decimal("0.01")),
        ("0.5", Decimal("0.5")),
        ("64Mi", Decimal(64 * 2**20)),
        ("1G", Decimal(10**9)),
        ("1.5Gi", Decimal(3 * 2**29)),
        (".5", Decimal("0.5")),
    ],
)
def test_quantities_read_as_kubernetes_reads_them(raw: str, value: Decimal) -> None:
    assert quantity(raw) == value


@pytest.mark.parametrize("raw", ["", "-1", "1 Gi", "1gi", "1Gb", "1.", "Mi", "1e3x"])
def test_a_bad_quantity_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        quantity(raw)


def test_resources_parse_and_default() -> None:
    assert parse_resources("") == DEFAULT_RESOURCES
    assert parse_resources(" requests.cpu=20m , limits.memory=64Mi,requests.memory=64Mi") == {
        "requests": {"cpu": "20m", "memory": "64Mi"},
        "limits": {"memory": "64Mi"},
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("requests.gpu=1", "expected KIND.RESOURCE=QUANTITY"),
        ("cpu=10m", "expected KIND.RESOURCE=QUANTITY"),
        ("requests.cpu", "expected KIND.RESOURCE=QUANTITY"),
        ("requests.memory=lots", "requests.memory: 'lots' is not a quantity"),
        ("requests.memory=64Mi,limits.memory=32Mi", "limits.memory 32Mi is below"),
    ],
)
def test_bad_resources_name_the_variable_and_the_form(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="JSI_AGENT_RESOURCES") as info:
        parse_resources(text)
    assert says in str(info.value)


def test_pull_secrets_are_secret_names() -> None:
    assert parse_pull_secrets("") == ()
    assert parse_pull_secrets("regcred, team.registry,regcred") == ("regcred", "team.registry")
    for bad in ("RegCred", "a_b", "-x", "x" * 254):
        with pytest.raises(ValueError, match="JSI_AGENT_IMAGE_PULL_SECRETS"):
            parse_pull_secrets(bad)


def test_the_controller_reads_them_from_its_environment() -> None:
    s = settings_from_env(
        {
            "JSI_AGENT_RESOURCES": "requests.cpu=5m",
            "JSI_AGENT_IMAGE_PULL_SECRETS": "regcred",
        }
    )
    assert (s.resources, s.image_pull_secrets) == ({"requests": {"cpu": "5m"}}, ("regcred",))
    with pytest.raises(ValueError, match="JSI_AGENT_IMAGE_PULL_POLICY: 'always'"):
        settings_from_env({"JSI_AGENT_IMAGE_PULL_POLICY": "always"})


def test_the_controller_refuses_to_start_with_a_malformed_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anything runs: exit 2, the variable and the accepted form on stderr."""
    monkeypatch.setenv("JSI_AGENT_RESOURCES", "requests.cpu=ten")
    with pytest.raises(SystemExit) as info:
        main(["run"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "JSI_AGENT_RESOURCES: requests.cpu: 'ten' is not a quantity" in err
