"""Serving the admission webhook with kopf: the handlers (thin wrappers over the pure
:mod:`jobset_inplace.core.admission`) and a standalone runner.

In production the controller process serves the webhook (``register_webhooks`` is called on
the controller's registry and ``settings.admission.server`` is a :class:`kopf.WebhookServer`
with the serving certificate). The webhook configurations are static manifests
(``manifests/webhook/``), so kopf's self-managed configurations stay off
(``settings.admission.managed`` is None) and the controller needs no RBAC on them.

URL paths: ``/mutate-jobsets`` and ``/validate-jobsets`` (kopf routes ``/<handler id>``).

Standalone (tests, or a separate webhook Deployment)::

    python -m jobset_inplace.runtime.webhook_server --kubeconfig KUBECONFIG \\
        --addr 0.0.0.0 --port 9443 --cert tls.crt --key tls.key
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonpatch
import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from jobset_inplace import names
from jobset_inplace.core.admission import mutate, update_warnings, validate, warnings
from jobset_inplace.core.agent_access import account_before_pods
from jobset_inplace.core.agent_settings import parse_pull_secrets, parse_resources
from jobset_inplace.core.transform import DEFAULT_AGENT_IMAGE, AgentSettings

log = logging.getLogger("jobset_inplace.admission")  # one line per request: its verdict
accounts_log = logging.getLogger("jobset_inplace.admission.accounts")  # what admission made

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
MUTATE_ID = "mutate-jobsets"
VALIDATE_ID = "validate-jobsets"
DEFAULT_PORT = 9443
DEFAULT_CERT_DIR = "/etc/jobset-inplace/webhook-certs"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
# The admission waits for the agents' ServiceAccount to be made at most this long (the
# configuration's timeoutSeconds is 10); past it the pods race the keeper, as before
ACCOUNT_TIMEOUT_S = 3.0

# Makes what a JobSet's pods need before they exist, while it is admitted: (namespace, JobSet)
AccountMaker = Callable[[str, Mapping[str, Any]], None]


def settings_from_env(env: Mapping[str, str] | None = None) -> AgentSettings:
    """Agent settings for the transform: ``JSI_AGENT_IMAGE`` (default
    ``jobset-inplace/agent:<version>``), ``JSI_AGENT_IMAGE_PULL_POLICY`` (default
    ``IfNotPresent``), ``JSI_AGENT_API_SERVER`` (default: in-cluster config),
    ``JSI_AGENT_RESOURCES`` and ``JSI_AGENT_IMAGE_PULL_SECRETS``
    (:mod:`jobset_inplace.core.agent_settings`). ValueError names a malformed variable."""
    e = os.environ if env is None else env
    policy = e.get(names.ENV_AGENT_PULL_POLICY) or "IfNotPresent"
    if policy not in PULL_POLICIES:
        raise ValueError(
            f"{names.ENV_AGENT_PULL_POLICY}: {policy!r}: expected one of {', '.join(PULL_POLICIES)}"
        )
    return AgentSettings(
        image=e.get(names.ENV_AGENT_IMAGE) or DEFAULT_AGENT_IMAGE,
        image_pull_policy=policy,
        api_server=e.get(names.ENV_AGENT_API_SERVER) or None,
        resources=parse_resources(e.get(names.ENV_AGENT_RESOURCES, "")),
        image_pull_secrets=parse_pull_secrets(e.get(names.ENV_AGENT_PULL_SECRETS, "")),
    )


def _object(body: kopf.Body) -> dict[str, Any]:
    return dict(body)


def account_maker(api: client.ApiClient) -> AccountMaker:
    """Makes the agents' ServiceAccount of a JobSet's namespace while the JobSet is admitted
    (:func:`~jobset_inplace.core.agent_access.account_before_pods`: what and why), so that its
    first pods are not refused for want of it. One create, its AlreadyExists the usual
    answer; a failure is logged and admits the JobSet all the same (the controller's keeper
    makes the account from its watch, as it always has)."""
    core = client.CoreV1Api(api)

    def make(namespace: str, jobset: Mapping[str, Any]) -> None:
        body = account_before_pods(namespace, jobset)
        if body is None:
            return
        account = f"{namespace}/{body['metadata']['name']}"
        try:
            core.create_namespaced_service_account(
                namespace, body, _request_timeout=ACCOUNT_TIMEOUT_S
            )
        except ApiException as e:
            if e.status != 409:
                accounts_log.warning(
                    "ServiceAccount %s not made at admission (%s %s): the JobSet's first pods "
                    "wait for the controller to make it",
                    account,
                    e.status,
                    e.reason,
                )
        except (HTTPError, OSError) as e:
            accounts_log.warning("ServiceAccount %s not made at admission: %s", account, e)
        else:
            accounts_log.info(
                "ServiceAccount %s made at admission, before its JobSet's pods", account
            )

    return make


def register_webhooks(
    registry: kopf.OperatorRegistry,
    settings: AgentSettings,
    make_account: AccountMaker | None = None,
) -> None:
    """Register the JobSet mutating (CREATE) and validating (CREATE, UPDATE) handlers into
    ``registry``. Both log one line per request (what reached the webhook and the verdict).
    ``make_account``: called for an admitted CREATE that is not a dry run (the mutating
    configuration says ``sideEffects: NoneOnDryRun``)."""

    @kopf.on.mutate(
        JOBSET_GROUP,
        JOBSET_VERSION,
        JOBSET_PLURAL,
        id=MUTATE_ID,
        operations=["CREATE"],
        registry=registry,
    )
    def mutate_jobset(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        obj, operation = _object(body), kwargs.get("operation")
        name = _ref(obj)
        allowed, message = validate(obj)
        if not allowed:
            log.info("mutate %s %s: denied: %s", operation, name, message)
            raise kopf.AdmissionError(message, code=400)
        ops = mutate(obj, settings)
        log.info("mutate %s %s: %d patch ops", operation, name, len(ops))
        namespace = (obj.get("metadata") or {}).get("namespace") or kwargs.get("namespace")
        if make_account is not None and namespace and not kwargs.get("dryrun"):
            make_account(str(namespace), obj)
        if ops:
            # kopf diffs the body before/after its transformation functions; applying our
            # exact ops keeps webhook.mutate the one source of truth for the patch.
            patch.fns.append(lambda raw: jsonpatch.apply_patch(raw, ops, in_place=True))

    @kopf.on.validate(
        JOBSET_GROUP,
        JOBSET_VERSION,
        JOBSET_PLURAL,
        id=VALIDATE_ID,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    def validate_jobset(body: kopf.Body, **kwargs: Any) -> None:
        obj, operation, old = _object(body), kwargs.get("operation"), kwargs.get("old")
        previous = dict(old) if operation == "UPDATE" and old is not None else None
        allowed, message = validate(obj, previous)
        log.info("validate %s %s: %s", operation, _ref(obj), "allowed" if allowed else message)
        if not allowed:
            raise kopf.AdmissionError(message, code=400)
        if operation == "CREATE":
            kwargs["warnings"].extend(warnings(obj))
        elif previous is not None:
            kwargs["warnings"].extend(update_warnings(obj, previous))


def _ref(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name') or meta.get('generateName', '')}"


def webhook_server(
    *,
    cert: str,
    key: str,
    port: int = DEFAULT_PORT,
    addr: str | None = None,
    host: str | None = None,
) -> kopf.WebhookServer:
    """The HTTPS server for ``settings.admission.server``: ``cert``/``key`` are the serving
    certificate files (re-read by kopf when they change, e.g. cert-manager renewals)."""
    return kopf.WebhookServer(addr=addr, port=port, host=host, certfile=cert, pkeyfile=key)


def cert_dir_from_env(env: Mapping[str, str] | None = None) -> Path:
    """Where the serving certificate is (``JSI_WEBHOOK_CERT_DIR``, default
    /etc/jobset-inplace/webhook-certs): mounted from a Secret, or written by the controller."""
    e = os.environ if env is None else env
    return Path(e.get(names.ENV_WEBHOOK_CERT_DIR, DEFAULT_CERT_DIR))


def server_from_env(env: dict[str, str] | None = None) -> kopf.WebhookServer | None:
    """The controller's webhook server, if ``JSI_WEBHOOK_CERT_DIR`` holds tls.crt/tls.key
    (else None: the controller runs without serving admission)."""
    e = os.environ if env is None else env
    cert_dir = cert_dir_from_env(e)
    cert, key = str(cert_dir / "tls.crt"), str(cert_dir / "tls.key")
    if not (os.path.exists(cert) and os.path.exists(key)):
        return None
    return webhook_server(cert=cert, key=key, port=webhook_port_from_env(e))


def webhook_port_from_env(env: Mapping[str, str] | None = None) -> int:
    """The webhook server's port (``JSI_WEBHOOK_PORT``, default 9443)."""
    e = os.environ if env is None else env
    return int(e.get(names.ENV_WEBHOOK_PORT, DEFAULT_PORT))


def _api_client(kubeconfig: str | None) -> client.ApiClient:
    """The API client of the webhook's own writes: the kubeconfig's, else the process's
    default configuration (in the cluster, the controller's)."""
    if not kubeconfig:
        return client.ApiClient()
    from kubernetes import config  # noqa: PLC0415 (only the runner needs it)

    return config.new_client_from_config(config_file=kubeconfig)


def connection_from_kubeconfig(path: str) -> kopf.ConnectionInfo:
    """kopf credentials from a kubeconfig file (without touching the client's global
    default configuration)."""
    from kubernetes import config  # noqa: PLC0415 (only the runner needs it)

    c = config.new_client_from_config(config_file=path).configuration
    auth = (c.api_key or {}).get("authorization") or (c.api_key or {}).get("BearerToken")
    scheme, _, token = (auth or "").partition(" ")
    return kopf.ConnectionInfo(
        server=c.host,
        ca_path=c.ssl_ca_cert,
        insecure=not c.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=c.cert_file,
        private_key_path=c.key_file,
    )


async def serve(
    *,
    kubeconfig: str | None,
    server: kopf.WebhookServer | None,
    settings: AgentSettings,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the admission webhook (when ``server``: it has a certificate), with no controller
    handlers, until ``stop_flag``. Standalone, or on its own thread in every replica of
    ``jobset-inplace run``, leader or not (the controller's operator, which only the leader
    runs, does not serve it)."""
    registry = kopf.OperatorRegistry()
    if server is not None:
        register_webhooks(registry, settings, account_maker(_api_client(kubeconfig)))

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if kubeconfig:
            return connection_from_kubeconfig(kubeconfig)
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True
        settings.posting.enabled = False
        settings.admission.server = server
        settings.admission.managed = None  # configurations are manifests/webhook/

    await kopf.operator(
        registry=registry,
        clusterwide=True,
        standalone=True,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m jobset_inplace.runtime.webhook_server",
        description="Serve the jobset-inplace admission webhook (mutate/validate JobSets). "
        "Agent settings from $JSI_AGENT_* (docs/webhook.md).",
    )
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    p.add_argument("--addr", default="0.0.0.0", help="listen address")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--cert", required=True, help="serving certificate (PEM)")
    p.add_argument("--key", required=True, help="its private key (PEM)")
    p.add_argument("--agent-image", help="overrides $JSI_AGENT_IMAGE")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("kopf").setLevel(logging.WARNING)
    try:
        settings = settings_from_env()
    except ValueError as e:
        p.error(str(e))
    if args.agent_image:
        settings = dataclasses.replace(settings, image=args.agent_image)
    server = webhook_server(cert=args.cert, key=args.key, port=args.port, addr=args.addr)
    asyncio.run(serve(kubeconfig=args.kubeconfig, server=server, settings=settings))


if __name__ == "__main__":
    main()
