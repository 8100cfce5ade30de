"""Rewriting upstream JobSet/Kueue manifests for webhooks served on loopback."""

from __future__ import annotations

import base64
from typing import Any

from testbed.addons import rewrite_for_loopback

CA = b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"


def _objs() -> list[dict[str, Any]]:
    svc = {"name": "webhook-service", "namespace": "x-system"}
    return [
        {"kind": "Namespace", "metadata": {"name": "x-system"}},
        {"kind": "Namespace", "metadata": {"name": "system"}},
        {"kind": "Deployment", "metadata": {"name": "manager"}},
        {"kind": "Service", "metadata": {"name": "webhook-service"}},
        {"kind": "APIService", "metadata": {"name": "v1.visibility"}},
        {
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "m"},
            "webhooks": [
                {
                    "name": "a.kb.io",
                    "failurePolicy": "Fail",
                    "matchPolicy": "Equivalent",
                    "clientConfig": {"service": {**svc, "path": "/mutate-a"}},
                },
            ],
        },
        {
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "as.x.io", "annotations": {"cert-manager.io/inject-ca-from": "x"}},
            "spec": {
                "conversion": {
                    "strategy": "Webhook",
                    "webhook": {
                        "conversionReviewVersions": ["v1"],
                        "clientConfig": {"service": {**svc, "path": "/convert"}},
                    },
                }
            },
        },
        {
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "bs.x.io"},
            "spec": {"conversion": {"strategy": "None"}},
        },
    ]


def test_keeps_only_what_a_process_install_needs() -> None:
    out = rewrite_for_loopback(_objs(), "https://127.0.0.1:9443", CA, namespace="x-system")
    assert [(o["kind"], o["metadata"]["name"]) for o in out] == [
        ("Namespace", "x-system"),
        ("MutatingWebhookConfiguration", "m"),
        ("CustomResourceDefinition", "as.x.io"),
        ("CustomResourceDefinition", "bs.x.io"),
    ]


def test_admission_and_conversion_webhooks_point_at_loopback_with_ca() -> None:
    out = rewrite_for_loopback(_objs(), "https://127.0.0.1:9443", CA, namespace="x-system")
    hook = out[1]["webhooks"][0]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-a",
        "caBundle": base64.b64encode(CA).decode(),
    }
    assert hook["failurePolicy"] == "Fail"  # upstream semantics untouched
    conv = out[2]["spec"]["conversion"]["webhook"]
    assert conv["clientConfig"]["url"] == "https://127.0.0.1:9443/convert"
    assert conv["conversionReviewVersions"] == ["v1"]
    assert "cert-manager.io/inject-ca-from" not in out[2]["metadata"]["annotations"]
    assert out[3]["spec"]["conversion"] == {"strategy": "None"}


def test_input_is_not_modified() -> None:
    objs = _objs()
    rewrite_for_loopback(objs, "https://127.0.0.1:1", CA, namespace="x-system")
    assert objs == _objs()
