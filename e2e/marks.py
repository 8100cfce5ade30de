"""Marks shared by the e2e tests.

``kube_release``: a test of what differs between the supported Kubernetes releases: the pod
restart scope (``RestartAllContainers`` and ``NodeDeclaredFeatures``, alpha gates on 1.35),
device health and DRA device taints (gated on 1.35), the kubelet's and the node lifecycle's
handling of a node that fails or drains, and the cluster itself. CI runs the whole e2e suite
on the default release and these on the older one too (docs/testing.md, "Which tests run on
which release")."""

from __future__ import annotations

import pytest

KUBE_RELEASE = pytest.mark.kube_release
# the pod restart scope as a test parameter: the in-place path whose gates differ by release
POD_SCOPE = pytest.param("pod", marks=KUBE_RELEASE)
