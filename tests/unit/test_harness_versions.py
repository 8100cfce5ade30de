from __future__ import annotations

import re

import pytest

from testbed.versions import parse_versions, versions


def test_pinned_versions_file_parses_to_semver_tags() -> None:
    v = versions()
    for value in vars(v).values():
        assert re.fullmatch(r"v\d+\.\d+\.\d+", value), value
    assert v.kubernetes.startswith("v1.3")


def test_missing_key_is_named() -> None:
    with pytest.raises(ValueError, match="missing KUEUE_VERSION"):
        parse_versions(
            "KUBERNETES_VERSION=v1\nETCD_VERSION=v2\nKWOK_VERSION=v3\nJOBSET_VERSION=v4\n"
        )


def test_malformed_line_is_quoted() -> None:
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_versions("KUBERNETES_VERSION v1.35.4\n")
