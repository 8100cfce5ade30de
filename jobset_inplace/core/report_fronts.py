"""Report fronts' rules (docs/design/report-fronts.md), pure: which fronts the leader names,
and how its election Lease says where its link is.

* A front says hello on the link (its URL and pin) with each batch, and alone every
  :data:`HELLO_EVERY_S` it has sent nothing; the leader names the fronts it heard from within
  :data:`FRONT_TTL_S` (:func:`live_fronts`), sorted, at most ``FRONTS_MAX``: a front gone
  drops out of the status after at most that long, while its agents, whose reports it no
  longer answers, already send them to the leader itself.
* The leader writes its link's URL and its certificate's pin on its election Lease
  (:func:`link_annotations`); every candidate reads the Lease each retry period, and so learns
  a new leader's link as it learns there is a new leader (:func:`link_of`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from jobset_inplace import names
from jobset_inplace.protocol.gangstate import FRONTS_MAX, Front, parse_front

HELLO_EVERY_S: Final = 5.0
FRONT_TTL_S: Final = 3 * HELLO_EVERY_S


@dataclass(frozen=True)
class Link:
    """Where the leader takes fronts' batches: its address, its certificate's SHA-256."""

    host: str
    port: int
    pin: str

    @property
    def url(self) -> str:
        return https_url(self.host, self.port, names.REPORT_LINK_PATH)


def https_url(host: str, port: int, path: str) -> str:
    """The URL of a report channel, front or link (an IPv6 address in brackets)."""
    where = f"[{host}]" if ":" in host else host
    return f"https://{where}:{port}{path}"


def live_fronts(heard: Mapping[Front, float], now: float) -> tuple[Front, ...]:
    """The fronts to name: those heard from (``heard``: front -> when, monotonic) within
    FRONT_TTL_S of ``now``, sorted by URL, the first FRONTS_MAX."""
    alive = sorted((f for f, at in heard.items() if now - at <= FRONT_TTL_S), key=_url)
    return tuple(alive[:FRONTS_MAX])


def _url(front: Front) -> str:
    return front.url


def link_annotations(link: Link) -> dict[str, str]:
    """The Lease annotations that name ``link``."""
    return {names.LEASE_REPORT_LINK: link.url, names.LEASE_REPORT_LINK_PIN: link.pin}


def link_of(annotations: Mapping[str, str] | None) -> Link | None:
    """The link a Lease's annotations name; None where they name none or an unusable one."""
    if not annotations:
        return None
    named = parse_front(
        {
            names.ENDPOINT_URL: annotations.get(names.LEASE_REPORT_LINK),
            names.ENDPOINT_CERT_SHA256: annotations.get(names.LEASE_REPORT_LINK_PIN),
        }
    )
    if named is None:
        return None
    # https://HOST:PORT/PATH, as Link.url writes it (the core imports no URL parser)
    where, slash, path = named.url.removeprefix("https://").partition("/")
    host, _, port = where.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not (host and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return None
    if slash + path != names.REPORT_LINK_PATH:
        return None
    return Link(host, int(port), named.cert_sha256)
