"""What the rendered chart must say: replicas, PDBs, probes, etcd endpoints, ids, security, network policies.

Each test reads `helm template` output of the real helm binary for the ci/ values files; removing a
PDB, a probe or an etcd endpoint from the templates makes one of them fail.
"""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
from typing import Any

import pytest

from gregor.common.config import BrokerConfig
from gregor.common.properties import read_properties
from tests.deploy.chart import (CHART, CI_VALUES, NAMESPACE, RELEASE, arg, component, containers, find, helm, name, one,
                                render, template_args, workloads)

GREGOR_ROLES = ("controller", "broker", "coordinator", "gateway")
ETCD_ROLES = ("controller", "broker", "coordinator", "gateway")  # the gateway: ACLs and quotas per caller


def etcd_endpoints(members: int) -> list[str]:
    return [f"http://{RELEASE}-etcd-{i}.{RELEASE}-etcd-headless.{NAMESPACE}.svc.cluster.local:2379"
            for i in range(members)]


PROPERTIES_FILE = {"controller": "server.properties", "broker": "server.properties",
                   "coordinator": "server.properties", "gateway": "producer.properties"}


def workload(manifests: list[dict[str, Any]], role: str) -> dict[str, Any]:
    return one(manifests, "Deployment" if role == "gateway" else "StatefulSet", name(role))


def write_properties(manifests: list[dict[str, Any]], role: str, tmp_path: Any) -> Any:
    """The role's rendered properties file, written where its parser can read it."""
    path = tmp_path / f"{role}-{PROPERTIES_FILE[role]}"
    path.write_text(one(manifests, "ConfigMap", name(role))["data"][PROPERTIES_FILE[role]])
    return path


def role_properties(manifests: list[dict[str, Any]], role: str, tmp_path: Any) -> dict[str, str]:
    return read_properties(str(write_properties(manifests, role, tmp_path)))


def role_etcd(manifests: list[dict[str, Any]], role: str, tmp_path: Any) -> str:
    """The etcd endpoints a role is started with: etcd.endpoints of its properties file, which it gets by --config."""
    assert arg(containers(workload(manifests, role))[0], "--config") == f"/etc/gregor/{PROPERTIES_FILE[role]}"
    return role_properties(manifests, role, tmp_path)["etcd.endpoints"]


@pytest.mark.parametrize("ci_file, expected", [
    ("default-values.yaml", {"etcd": 3, "controller": 2, "broker": 3, "coordinator": 1, "gateway": 2}),
    ("minimal-values.yaml", {"etcd": 1, "controller": 1, "broker": 1, "coordinator": 1, "gateway": 1}),
    ("high-availability-values.yaml", {"etcd": 3, "controller": 3, "broker": 5, "coordinator": 2}),
    ("external-etcd-values.yaml", {"controller": 2, "broker": 3, "coordinator": 1, "gateway": 2}),
])
def test_replica_counts(ci_file: str, expected: dict[str, int]) -> None:
    got = {component(w): w["spec"].get("replicas") for w in workloads(render(ci_file))}
    assert {k: got.get(k) for k in expected} == expected
    assert set(got) == set(expected) | ({"gateway"} if "gateway" not in expected else set())


def test_ha_gateways_scale_by_hpa_instead_of_a_fixed_count() -> None:
    manifests = render("high-availability-values.yaml")
    assert "replicas" not in one(manifests, "Deployment", name("gateway"))["spec"]
    hpa = one(manifests, "HorizontalPodAutoscaler", name("gateway"))
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 10)
    assert hpa["spec"]["scaleTargetRef"]["name"] == name("gateway")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("ci_file", CI_VALUES)
def test_every_workload_has_a_pdb_with_max_unavailable_1(ci_file: str) -> None:
    manifests = render(ci_file)
    pdbs = find(manifests, "PodDisruptionBudget")
    for w in workloads(manifests):
        labels = w["spec"]["template"]["metadata"]["labels"]
        covering = [p for p in pdbs if selects(p["spec"]["selector"]["matchLabels"], labels)]
        assert len(covering) == 1, f"{w['metadata']['name']}: {len(covering)} PDBs select its pods"
        assert covering[0]["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("ci_file", CI_VALUES)
def test_grpc_probes_on_the_health_port_of_every_role(ci_file: str) -> None:
    for w in workloads(render(ci_file)):
        c = containers(w)[0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert probe in c, f"{w['metadata']['name']}: no {probe}"
            if component(w) == "etcd":  # etcd's own /livez and /readyz on its metrics listener
                assert c[probe]["httpGet"]["port"] == "metrics"
                assert c[probe]["httpGet"]["path"] in ("/livez", "/readyz")
            else:  # grpc.health.v1 (service "": the whole server) on the role's gRPC port
                assert c[probe]["grpc"] == {"port": ports["grpc"]}, f"{w['metadata']['name']} {probe}"


@pytest.mark.parametrize("ci_file, members", [(f, 1 if f.startswith("minimal") else 3)
                                              for f in CI_VALUES if not f.startswith("external")])
def test_in_chart_etcd_endpoints_in_every_role(ci_file: str, members: int, tmp_path: Any) -> None:
    manifests = render(ci_file)
    expected = etcd_endpoints(members)
    etcd = one(manifests, "StatefulSet", name("etcd"))
    assert etcd["spec"]["serviceName"] == f"{RELEASE}-etcd-headless"
    assert one(manifests, "Service", f"{RELEASE}-etcd-headless")["spec"]["clusterIP"] == "None"
    for role in ETCD_ROLES:
        assert role_etcd(manifests, role, tmp_path).split(",") == expected, role
    env = {e["name"]: e.get("value") for e in containers(etcd)[0]["env"]}
    assert env["ETCD_INITIAL_CLUSTER"].split(",") == [
        f"{RELEASE}-etcd-{i}=http://{RELEASE}-etcd-{i}.{RELEASE}-etcd-headless.{NAMESPACE}.svc.cluster.local:2380"
        for i in range(members)]


def test_external_etcd_endpoints_in_every_role_and_no_etcd_of_our_own(tmp_path: Any) -> None:
    manifests = render("external-etcd-values.yaml")
    assert not [m for m in manifests if component(m) == "etcd"]
    expected = [f"http://etcd-{i}.etcd.infra.svc.cluster.local:2379" for i in range(3)]
    for role in ETCD_ROLES:
        assert role_etcd(manifests, role, tmp_path).split(",") == expected, role


def test_gateway_bootstraps_from_every_broker(tmp_path: Any) -> None:
    props = role_properties(render("high-availability-values.yaml"), "gateway", tmp_path)
    assert props["bootstrap.servers"].split(",") == [
        f"{RELEASE}-broker-{i}.{RELEASE}-broker-headless.{NAMESPACE}.svc.cluster.local:9092" for i in range(5)]


def field_ref(container: dict[str, Any], env: str) -> str:
    [entry] = [e for e in container["env"] if e["name"] == env]
    return str(entry["valueFrom"]["fieldRef"]["fieldPath"])


def test_broker_ids_from_ordinals_and_rack_from_the_topology_label() -> None:
    broker = one(render(), "StatefulSet", name("broker"))
    c = containers(broker)[0]
    assert arg(c, "--broker-id") == "$(BROKER_ID)"
    assert field_ref(c, "BROKER_ID") == "metadata.labels['apps.kubernetes.io/pod-index']"
    overrides = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--override=")]
    assert "broker.rack=$(BROKER_RACK)" in overrides
    assert field_ref(c, "BROKER_RACK") == "metadata.labels['topology.kubernetes.io/zone']"
    assert arg(c, "--host") == "$(POD_IP)"
    # Per-broker stable names: a headless Service that publishes pods before they are ready.
    headless = one(render(), "Service", f"{RELEASE}-broker-headless")
    assert broker["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    for role, flag in (("controller", "--controller-id"), ("coordinator", "--coordinator-id")):
        ctr = containers(one(render(), "StatefulSet", name(role)))[0]
        env = flag.lstrip("-").replace("-", "_").upper()
        assert arg(ctr, flag) == f"$({env})"
        assert field_ref(ctr, env) == "metadata.labels['apps.kubernetes.io/pod-index']"


def test_brokers_serve_the_kafka_protocol_on_their_own_port() -> None:
    """Kafka clients bootstrap from the broker Service's `kafka` port and reach each broker at its advertised
    pod address; kafkaListener.enabled=false leaves no trace of it."""
    c = containers(one(render(), "StatefulSet", name("broker")))[0]
    overrides = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--override=")]
    assert "listeners=PLAINTEXT://$(POD_IP):9096" in overrides
    assert "advertised.listeners=PLAINTEXT://$(POD_IP):9096" in overrides
    assert {"name": "kafka", "containerPort": 9096} in c["ports"]
    for svc in (f"{RELEASE}-broker", f"{RELEASE}-broker-headless"):
        ports = one(render(), "Service", svc)["spec"]["ports"]
        assert {"name": "kafka", "port": 9096, "targetPort": "kafka"} in ports, svc
    off = containers(one(render(None, "brokers.kafkaListener.enabled=false"), "StatefulSet", name("broker")))[0]
    assert not [a for a in off["args"] if "listeners" in a] and "kafka" not in {p["name"] for p in off["ports"]}


def test_no_rack_env_when_rack_is_off() -> None:
    c = containers(one(render(None, "brokers.rack.enabled=false"), "StatefulSet", name("broker")))[0]
    assert not [a for a in c["args"] if "broker.rack" in a]
    assert "BROKER_RACK" not in {e["name"] for e in c["env"]}


@pytest.mark.parametrize("ci_file", CI_VALUES)
def test_broker_properties_are_what_the_broker_accepts(ci_file: str, tmp_path: Any) -> None:
    """The rendered server.properties goes through the broker's own parser without an error."""
    props = role_properties(render(ci_file), "broker", tmp_path)
    cfg = BrokerConfig.from_properties(props, broker_id=0)
    assert cfg.etcd_endpoints == props["etcd.endpoints"] and cfg.cluster_id == "gregor"
    assert props["log.segment.bytes"] == "1073741824"  # not Go's 1.073741824e+09


def test_brokers_persist_their_log_dirs_on_a_pvc_each() -> None:
    broker = one(render(), "StatefulSet", name("broker"))
    [claim] = broker["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    mount = {m["name"]: m["mountPath"] for m in containers(broker)[0]["volumeMounts"]}["data"]
    assert arg(containers(broker)[0], "--log-dirs") == mount + "/logs"  # not the volume root (lost+found)
    minimal = one(render("minimal-values.yaml"), "StatefulSet", name("broker"))
    assert "volumeClaimTemplates" not in minimal["spec"]
    assert {"name": "data", "emptyDir": {}} in minimal["spec"]["template"]["spec"]["volumes"]


def test_prestop_runs_controlled_shutdown_within_the_grace_period() -> None:
    broker = one(render(), "StatefulSet", name("broker"))
    c = containers(broker)[0]
    command = " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    assert "gregor-broker-shutdown" in command and '--broker-id "$BROKER_ID"' in command
    cfg = BrokerConfig.from_properties({"controlled.shutdown.max.retries": "3",
                                        "controlled.shutdown.retry.backoff.ms": "5000"})
    retries_s = cfg.controlled_shutdown_max_retries * cfg.controlled_shutdown_retry_backoff_ms / 1000
    assert broker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 2 * retries_s
    assert broker["spec"]["updateStrategy"]["type"] == "RollingUpdate"


@pytest.mark.parametrize("ci_file", CI_VALUES)
def test_hardened_security_context_everywhere(ci_file: str) -> None:
    pods = [w["spec"]["template"]["spec"] for w in workloads(render(ci_file))]
    pods += [p["spec"] for p in find(render(ci_file), "Pod")]
    for spec in pods:
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]


def test_anti_affinity_presets() -> None:
    soft = one(render(), "StatefulSet", name("broker"))["spec"]["template"]["spec"]["affinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in soft["podAntiAffinity"]
    for w in workloads(render("high-availability-values.yaml")):
        hard = w["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert hard[0]["topologyKey"] == "kubernetes.io/hostname"
        assert hard[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == component(w)
        [spread] = w["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert spread["whenUnsatisfiable"] == "DoNotSchedule"
        assert spread["topologyKey"] == "topology.kubernetes.io/zone"


def test_metrics_services_and_scrape_annotations() -> None:
    manifests = render()
    metrics = {component(s): s for s in find(manifests, "Service") if s["metadata"]["name"].endswith("-metrics")}
    assert set(metrics) == {"etcd", *GREGOR_ROLES}
    for w in workloads(manifests):
        ann = w["spec"]["template"]["metadata"]["annotations"]
        port = {p["name"]: p["containerPort"] for p in containers(w)[0]["ports"]}["metrics"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == str(port)
        assert metrics[component(w)]["spec"]["ports"][0]["targetPort"] == "metrics"
    off = render(None, "metrics.enabled=false")
    assert not [s for s in find(off, "Service") if s["metadata"]["name"].endswith("-metrics")]
    assert all(arg(containers(w)[0], "--metrics-port") == "-1" for w in workloads(off) if component(w) != "etcd")


def policy_rules(manifests: list[dict[str, Any]], role: str) -> dict[frozenset[int], set[str]]:
    """port set -> the components (or 'client' / 'any') allowed to reach it."""
    out: dict[frozenset[int], set[str]] = {}
    for rule in one(manifests, "NetworkPolicy", name(role))["spec"]["ingress"]:
        ports = frozenset(p["port"] for p in rule["ports"])
        if "from" not in rule:
            out[ports] = {"any"}
            continue
        peers = set()
        for peer in rule["from"]:
            labels = peer["podSelector"]["matchLabels"]
            peers.add(labels.get("app.kubernetes.io/component", "client" if f"{RELEASE}-client" in labels else "?"))
        out[ports] = peers
    return out


def test_network_policies_open_only_the_ports_each_role_needs() -> None:
    manifests = render("high-availability-values.yaml")
    assert policy_rules(manifests, "etcd") == {
        frozenset({2379}): {"controller", "broker", "coordinator", "gateway", "etcd"}, frozenset({2380}): {"etcd"},
        frozenset({2381}): {"any"}}
    assert policy_rules(manifests, "controller") == {frozenset({9091}): {"broker"}, frozenset({9404}): {"any"}}
    assert policy_rules(manifests, "broker") == {
        frozenset({9092, 9093, 9096}): {"controller", "broker", "coordinator", "gateway", "client"},
        frozenset({9404}): {"any"}}
    assert policy_rules(manifests, "coordinator") == {frozenset({9094}): {"client"}, frozenset({9404}): {"any"}}
    assert policy_rules(manifests, "gateway") == {frozenset({9095}): {"client"}, frozenset({9404}): {"any"}}
    # The helm test Pod carries the client label, so it passes the policies it must.
    test_pod = one(manifests, "Pod", name("test"))
    assert test_pod["metadata"]["labels"][f"{RELEASE}-client"] == "true"
    # allowExternal: client ports open to any pod; component-only ports stay closed.
    open_ = render(None, "networkPolicy.enabled=true")
    assert policy_rules(open_, "gateway")[frozenset({9095})] == {"any"}
    assert policy_rules(open_, "controller")[frozenset({9091})] == {"broker"}
    assert not find(render(), "NetworkPolicy")


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args."""
    out = []
    for a in args:
        for k, v in env.items():
            a = a.replace(f"$({k})", v)
        out.append(a)
    return out


POD_ENV = {"POD_IP": "10.0.0.7", "BROKER_ID": "2", "BROKER_RACK": "zone-b", "CONTROLLER_ID": "1",
           "COORDINATOR_ID": "0"}


def role_args(manifests: list[dict[str, Any]], role: str, tmp_path: Any) -> list[str]:
    """A role's container args as Kubernetes expands them, its mounted properties file swapped for a local copy."""
    path = write_properties(manifests, role, tmp_path)
    mounted = f"/etc/gregor/{PROPERTIES_FILE[role]}"
    return [a.replace(mounted, str(path)) for a in expand(containers(workload(manifests, role))[0]["args"], POD_ENV)]


@pytest.mark.parametrize("ci_file", CI_VALUES)
def test_every_role_parser_accepts_the_rendered_command_line_and_properties(ci_file: str, tmp_path: Any) -> None:
    """The flags and properties files the chart renders are what each role's own parser takes (no drift),
    and the values' settings arrive in the parsed result through the file."""
    from gregor.broker.__main__ import parse_args as broker_args
    from gregor.controller.__main__ import parse_args as controller_args
    from gregor.coordinator.__main__ import parse_args as coordinator_args
    from gregor.gateway.__main__ import parse_args as gateway_args

    manifests = render(ci_file)
    command = containers(workload(manifests, "broker"))[0]["command"]
    # brokers.raiseOpenFileLimit (default on): the soft ulimit -n raised to the hard one, then the same argv.
    assert command == ["sh", "-c", 'ulimit -n "$(ulimit -Hn)" && exec gregor-broker "$@"', "gregor-broker"]
    fake = tmp_path / "gregor-broker"
    fake.write_text('#!/bin/sh\necho "$(ulimit -n) $*"\n')
    fake.chmod(0o755)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    run = subprocess.run([*command, "--broker-id=2", "--x=a b"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    assert run.stdout.split(" ", 1) == [str(hard) if hard != resource.RLIM_INFINITY else "unlimited",
                                        "--broker-id=2 --x=a b\n"]
    cfg, _ = broker_args(role_args(manifests, "broker", tmp_path))
    assert (cfg.broker_id, cfg.host, cfg.broker_rack, cfg.port) == (2, "10.0.0.7", "zone-b", 9092)
    assert cfg.etcd_endpoints == role_properties(manifests, "broker", tmp_path)["etcd.endpoints"]
    props = role_properties(manifests, "controller", tmp_path)
    c = controller_args(role_args(manifests, "controller", tmp_path))
    assert (c.controller_id, c.host, c.port, c.etcd, c.cluster) == (1, "10.0.0.7", 9091, props["etcd.endpoints"],
                                                                    props["cluster.id"])
    assert c.leader_balance.leader_imbalance_per_broker_percentage == int(props["leader.imbalance.per.broker.percentage"])
    assert c.delete_topic_enable is (props["delete.topic.enable"] == "true")
    props = role_properties(manifests, "coordinator", tmp_path)
    g = coordinator_args(role_args(manifests, "coordinator", tmp_path))
    assert (g.coordinator_id, g.port, g.etcd) == (0, 9094, props["etcd.endpoints"])
    assert g.config.offsets_topic_num_partitions == int(props["offsets.topic.num.partitions"])
    w = gateway_args(role_args(manifests, "gateway", tmp_path))
    assert w.props["compression.type"] == "lz4" and w.bootstrap.count(":9092") >= 1
    assert w.bootstrap == role_properties(manifests, "gateway", tmp_path)["bootstrap.servers"]


CHANGE = {"controller": "controllers.config.delete\\.topic\\.enable=false",
          "broker": "brokers.config.num\\.partitions=7", "coordinator": "coordinators.config.group\\.max\\.size=9",
          "gateway": "gateways.config.linger\\.ms=7"}  # one setting of each role's file


@pytest.mark.parametrize("role", GREGOR_ROLES)
def test_each_role_gets_its_properties_configmap_mounted_read_only_with_a_checksum(role: str) -> None:
    """One ConfigMap per role, mounted read-only at /etc/gregor and passed by --config; its sha256 is a pod
    annotation, so changing a value changes the pod template and rolls the pods."""
    manifests = render(None)
    text = one(manifests, "ConfigMap", name(role))["data"][PROPERTIES_FILE[role]]
    w = workload(manifests, role)
    pod = w["spec"]["template"]
    assert pod["metadata"]["annotations"]["checksum/config"] == hashlib.sha256(text.rstrip("\n").encode()).hexdigest()
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == name(role)
    mounts = {m["name"]: m for m in containers(w)[0]["volumeMounts"]}
    assert mounts["config"] == {"name": "config", "mountPath": "/etc/gregor", "readOnly": True}
    assert arg(containers(w)[0], "--config") == f"/etc/gregor/{PROPERTIES_FILE[role]}"
    changed = workload(render(None, CHANGE[role]), role)
    assert changed["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != \
        pod["metadata"]["annotations"]["checksum/config"]


def test_a_chart_owned_key_is_refused_by_the_template_too() -> None:
    """etcd.endpoints comes from etcd/externalEtcd: set in <role>.config it would fork the cluster. The schema
    refuses it (test_chart_checks); the template does as well when schema validation is skipped."""
    done = helm(*template_args(CHART, sets=("coordinators.config.etcd\\.endpoints=http://elsewhere:2379",)),
                "--skip-schema-validation", check=False)
    assert done.returncode != 0 and "coordinators.config.etcd.endpoints is set by the chart" in done.stderr


def test_a_coordinator_key_the_role_does_not_know_is_caught_here(tmp_path: Any) -> None:
    from gregor.coordinator.__main__ import parse_args as coordinator_args

    manifests = render(None, "coordinators.config.offsets\\.topic\\.bogus=1")
    assert role_properties(manifests, "coordinator", tmp_path)["offsets.topic.bogus"] == "1"
    with pytest.raises(SystemExit):
        coordinator_args(role_args(manifests, "coordinator", tmp_path))
