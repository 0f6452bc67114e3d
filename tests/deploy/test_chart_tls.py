"""The chart with `tls.enabled`: certificates from a Secret or from cert-manager Certificates, the TLS keys in
every role's rendered properties (accepted by the roles' own parsers), etcd on https with client-certificate
auth, TLS-only listeners and probes the kubelet can run against them (real `helm template` output)."""

from __future__ import annotations

from typing import Any

import pytest

from gregor.common.tls import TlsConfig
from tests.deploy.chart import CHART, NAMESPACE, RELEASE, containers, find, helm, name, one, render, template_args
from tests.deploy.test_chart_render import GREGOR_ROLES, POD_ENV, role_args, role_properties, workload

CERT_MANAGER = ("tls.enabled=true", "tls.certManager.enabled=true", "tls.certManager.issuerRef.name=gregor-ca",
                "tls.certManager.issuerRef.kind=ClusterIssuer")
SECRET = ("tls.enabled=true", "tls.existingSecret=gregor-certs")
MOUNT = "/etc/gregor/tls"


def volumes(w: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}


@pytest.mark.parametrize("sets", [CERT_MANAGER, SECRET], ids=["cert-manager", "existing-secret"])
def test_every_role_mounts_its_certificate_and_serves_tls(sets: tuple[str, ...], tmp_path: Any) -> None:
    manifests = render(None, *sets)
    for role in (*GREGOR_ROLES, "etcd"):
        w = workload(manifests, role)
        secret = volumes(w)["tls"]["secret"]["secretName"]
        assert secret == ("gregor-certs" if sets == SECRET else name(f"{role}-tls")), role
        mount = [m for m in containers(w)[0]["volumeMounts"] if m["name"] == "tls"]
        assert mount == [{"name": "tls", "mountPath": MOUNT, "readOnly": True}], role
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            action = containers(w)[0].get(probe, {})
            assert "grpc" not in action, (role, probe)  # the kubelet's gRPC probe cannot speak TLS
    for role in GREGOR_ROLES:
        props = role_properties(manifests, role, tmp_path)
        cfg = TlsConfig.from_properties(props)
        assert (cfg.enabled, cfg.truststore, cfg.keystore, cfg.key, cfg.client_auth) == (
            True, f"{MOUNT}/ca.crt", f"{MOUNT}/tls.crt", f"{MOUNT}/tls.key", "required"), role
        if role != "gateway":
            assert all(e.startswith("https://") for e in props["etcd.endpoints"].split(",")), role


def test_the_roles_parsers_take_the_tls_keys_and_dns_names(tmp_path: Any) -> None:
    from gregor.broker.__main__ import parse_args as broker_args
    from gregor.controller.__main__ import parse_args as controller_args
    from gregor.coordinator.__main__ import parse_args as coordinator_args
    from gregor.gateway.__main__ import parse_args as gateway_args

    manifests = render(None, *CERT_MANAGER)
    env = {**POD_ENV, "POD_NAME": "pod-x"}
    import tests.deploy.test_chart_render as r

    r.POD_ENV.update(env)
    try:
        cfg, _ = broker_args(role_args(manifests, "broker", tmp_path))
        assert cfg.tls.enabled and cfg.listeners.startswith("SSL://pod-x.")
        assert cfg.host == f"pod-x.{RELEASE}-broker-headless.{NAMESPACE}.svc.cluster.local"  # what the SANs name
        assert controller_args(role_args(manifests, "controller", tmp_path)).tls.enabled
        assert coordinator_args(role_args(manifests, "coordinator", tmp_path)).tls.enabled
        g = gateway_args(role_args(manifests, "gateway", tmp_path))
        assert g.tls.enabled and "ssl.client.auth" not in g.props  # the server's key is not its producer's
    finally:
        for k in ("POD_NAME",):
            r.POD_ENV.pop(k, None)


def test_cert_manager_issues_one_certificate_per_role_naming_its_dns_names() -> None:
    manifests = render(None, *CERT_MANAGER)
    certs = {c["metadata"]["name"]: c["spec"] for c in find(manifests, "Certificate")}
    assert set(certs) == {name(r) for r in ("etcd", "controller", "broker", "coordinator", "gateway", "client")}
    broker = certs[name("broker")]
    assert broker["secretName"] == name("broker-tls") and broker["commonName"] == "broker"
    assert f"*.{RELEASE}-broker-headless.{NAMESPACE}.svc.cluster.local" in broker["dnsNames"]
    assert broker["issuerRef"] == {"name": "gregor-ca", "kind": "ClusterIssuer"}
    assert {"server auth", "client auth"} <= set(broker["usages"])
    assert not find(render(None, *SECRET), "Certificate")


def test_etcd_serves_tls_with_client_certificate_auth_to_clients_and_peers() -> None:
    etcd = containers(one(render(None, *SECRET), "StatefulSet", name("etcd")))[0]
    env = {e["name"]: e.get("value") for e in etcd["env"]}
    assert env["ETCD_CLIENT_CERT_AUTH"] == "true" and env["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
    assert env["ETCD_TRUSTED_CA_FILE"] == env["ETCD_PEER_TRUSTED_CA_FILE"] == f"{MOUNT}/ca.crt"
    assert env["ETCD_LISTEN_CLIENT_URLS"].startswith("https://")
    assert env["ETCD_LISTEN_PEER_URLS"].startswith("https://")
    assert all(p.split("=", 1)[1].startswith("https://") for p in env["ETCD_INITIAL_CLUSTER"].split(","))
    assert env["ETCD_LISTEN_METRICS_URLS"].startswith("http://")  # the probes' port stays plain


def test_no_plain_text_listener_is_rendered_with_tls() -> None:
    text = "\n".join(str(m) for m in render(None, *CERT_MANAGER))
    assert "PLAINTEXT://" not in text and "http://0.0.0.0:2379" not in text


def test_helm_test_pod_uses_the_client_certificate() -> None:
    manifests = render(None, *CERT_MANAGER)
    cm = one(manifests, "ConfigMap", name("test"))
    assert "security.protocol=SSL" in cm["data"]["client.properties"]
    pod = one(manifests, "Pod", name("test"))
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["GREGOR_COMMAND_CONFIG"] == "/scripts/client.properties"
    assert {v["name"]: v for v in pod["spec"]["volumes"]}["tls"]["secret"]["secretName"] == name("client-tls")


@pytest.mark.parametrize("sets, message", [
    (("tls.enabled=true",), "set tls.existingSecret"),
    (("tls.enabled=true", "tls.certManager.enabled=true"), "issuerRef.name"),
    (("tls.enabled=true", "tls.existingSecret=s", "tls.clientAuth=sometimes"), "/tls/clientAuth"),
])
def test_incomplete_tls_values_are_refused(sets: tuple[str, ...], message: str) -> None:
    done = helm(*template_args(CHART, sets=sets), check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr


@pytest.mark.parametrize("https", [True, False], ids=["https", "plain-metrics"])
def test_metrics_are_served_and_scraped_over_https_with_tls(https: bool, tmp_path: Any) -> None:
    """tls.enabled: every role's /metrics is HTTPS (metrics.security.protocol=SSL), the ServiceMonitor and
    PodMonitor scrape with scheme https and the TLS Secret's CA, etcd's plain metrics listener relabelled
    http; metrics.https=false keeps /metrics plain on both sides."""
    manifests = render(None, *SECRET, "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
                       f"metrics.https={str(https).lower()}")
    for role in GREGOR_ROLES:
        cfg = TlsConfig.from_properties(role_properties(manifests, role, tmp_path))
        assert cfg.metrics_tls is https and cfg.metrics_scheme == ("https" if https else "http"), role
        annotations = workload(manifests, role)["spec"]["template"]["metadata"]["annotations"]
        assert annotations.get("prometheus.io/scheme") == ("https" if https else None), role
    for kind, key in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        (monitor,) = find(manifests, kind)
        (endpoint,) = monitor["spec"][key]
        if not https:
            assert "scheme" not in endpoint and "tlsConfig" not in endpoint
            continue
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "gregor-certs", "key": "ca.crt"}}
        assert {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"], "regex": "etcd",
                "targetLabel": "__scheme__", "replacement": "http"} in endpoint["relabelings"]
