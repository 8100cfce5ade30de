"""The injected agent's install-wide settings as the controller's environment gives them
(``JSI_AGENT_RESOURCES``, ``JSI_AGENT_IMAGE_PULL_SECRETS``), parsed once and checked the way
the apiserver would check the pod, so that a mistake is refused when the controller starts,
not found when every gang's Jobs fail to make pods. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

from jobset_inplace import names

# What the agent asks for unless told otherwise: it sleeps on a watch and a probe.
DEFAULT_RESOURCES: Mapping[str, Mapping[str, str]] = {"requests": {"cpu": "10m", "memory": "32Mi"}}
KINDS = ("requests", "limits")
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")

# Kubernetes quantities (k8s.io/apimachinery resource.Quantity): a decimal number and a suffix.
_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{p: Decimal(10) ** (3 * i) for i, p in enumerate("kMGTPE", 1)},
    **{p + "i": Decimal(2) ** (10 * i) for i, p in enumerate("KMGTPE", 1)},
}
_QUANTITY = re.compile(r"^(?P<number>[0-9]+(\.[0-9]+)?|\.[0-9]+)(?P<suffix>[a-zA-Z]{0,2})$")
# A Secret's name: a DNS-1123 subdomain.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def quantity(raw: str) -> Decimal:
    """The value of a Kubernetes quantity (``500m``, ``1.5Gi``); ValueError otherwise."""
    m = _QUANTITY.match(raw)
    if m is None or m["suffix"] not in _SUFFIX:
        raise ValueError(f"{raw!r} is not a quantity (e.g. 100m, 0.5, 64Mi, 1G)")
    try:
        return Decimal(m["number"]) * _SUFFIX[m["suffix"]]
    except InvalidOperation:
        raise ValueError(f"{raw!r} is not a quantity (e.g. 100m, 0.5, 64Mi, 1G)") from None


def parse_resources(text: str) -> dict[str, dict[str, str]]:
    """``requests.cpu=10m,requests.memory=32Mi,limits.memory=128Mi`` -> the container's
    ``resources``; empty text: :data:`DEFAULT_RESOURCES`. ValueError names the variable, the
    item and the accepted form; a limit below its request is refused (the apiserver would
    refuse every pod)."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        return {kind: dict(values) for kind, values in DEFAULT_RESOURCES.items()}
    form = (
        f"KIND.RESOURCE=QUANTITY with KIND {'|'.join(KINDS)}, RESOURCE {'|'.join(RESOURCE_NAMES)}"
    )
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        kind, dot, resource = key.strip().partition(".")
        if not sep or not dot or kind not in KINDS or resource not in RESOURCE_NAMES:
            raise ValueError(f"{names.ENV_AGENT_RESOURCES}: {item!r}: expected {form}")
        try:
            quantity(raw.strip())
        except ValueError as e:
            raise ValueError(f"{names.ENV_AGENT_RESOURCES}: {key.strip()}: {e}") from None
        out.setdefault(kind, {})[resource] = raw.strip()
    for resource, limit in out.get("limits", {}).items():
        request = out.get("requests", {}).get(resource)
        if request is not None and quantity(limit) < quantity(request):
            raise ValueError(
                f"{names.ENV_AGENT_RESOURCES}: limits.{resource} {limit} is below "
                f"requests.{resource} {request}"
            )
    return out


def parse_pull_secrets(text: str) -> tuple[str, ...]:
    """``regcred,other`` -> Secret names (DNS-1123 subdomains, at most 253 characters)."""
    secrets = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in secrets:
        if len(name) > 253 or not _SUBDOMAIN.match(name):
            raise ValueError(
                f"{names.ENV_AGENT_PULL_SECRETS}: {name!r} is not a Secret name (lower-case "
                "letters, digits, '-' and '.', starting and ending with a letter or digit; "
                "comma-separated)"
            )
    return tuple(dict.fromkeys(secrets))
