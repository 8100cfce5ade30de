"""The webhook certificate: what the core decides about material (can it go on serving, may its
CA sign again) over material the adapter's :func:`issue` makes."""

from __future__ import annotations

import dataclasses
import datetime

from jobset_inplace.core.certificate_rules import (
    CA_VALIDITY,
    CERT_VALIDITY,
    RENEW_BEFORE,
    Material,
    renewal_reason,
    service_dns_names,
    usable_ca,
)
from jobset_inplace.runtime.certificates import issue

NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
NAMES = service_dns_names("jobset-inplace-system")
DAY = datetime.timedelta(days=1)


def test_names_of_the_service() -> None:
    assert NAMES == [
        "jobset-inplace-webhook.jobset-inplace-system.svc",
        "jobset-inplace-webhook.jobset-inplace-system.svc.cluster.local",
    ]


def test_new_material_serves_its_names() -> None:
    assert renewal_reason(issue(NAMES, NOW), NAMES, NOW) == ""


def test_nothing_yet_or_a_partial_secret_is_renewed() -> None:
    assert renewal_reason(None, NAMES, NOW) == "no certificate yet"
    m = issue(NAMES, NOW)
    assert Material.from_secret_data(m.secret_data()) == m
    partial = {**m.secret_data(), "tls.key": b""}
    assert Material.from_secret_data(partial) is None


def test_unreadable_other_names_or_another_ca_are_renewed() -> None:
    m = issue(NAMES, NOW)
    assert renewal_reason(dataclasses.replace(m, tls_crt=b"junk"), NAMES, NOW).startswith(
        "unreadable material"
    )
    other_ns = service_dns_names("elsewhere")
    assert "lacks jobset-inplace-webhook.elsewhere.svc" in renewal_reason(m, other_ns, NOW)
    foreign = issue(NAMES, NOW)
    mixed = dataclasses.replace(m, ca_crt=foreign.ca_crt, ca_key=foreign.ca_key)
    assert renewal_reason(mixed, NAMES, NOW).startswith("serving certificate not signed by the CA")


def test_renewed_before_the_serving_certificate_expires() -> None:
    m = issue(NAMES, NOW)
    almost = NOW + CERT_VALIDITY - RENEW_BEFORE
    assert renewal_reason(m, NAMES, almost - DAY) == ""
    assert renewal_reason(m, NAMES, almost + DAY).startswith("serving certificate expires")


def test_a_new_serving_certificate_keeps_a_ca_that_outlives_it() -> None:
    m = issue(NAMES, NOW)
    ca = usable_ca(m, NOW)
    assert ca == (m.ca_crt, m.ca_key)
    again = issue(NAMES, NOW, ca)
    assert (again.ca_crt, again.ca_key) == (m.ca_crt, m.ca_key)
    assert again.tls_crt != m.tls_crt
    assert renewal_reason(again, NAMES, NOW) == ""


def test_a_ca_that_would_expire_before_the_next_certificate_is_replaced() -> None:
    m = issue(NAMES, NOW)
    # the CA (10 years) could not cover a new 1-year certificate plus the renewal margin
    late = NOW + CA_VALIDITY - CERT_VALIDITY - RENEW_BEFORE + DAY
    assert usable_ca(m, late) is None
    assert usable_ca(None, NOW) is None
