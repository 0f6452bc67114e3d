"""The chart's CI checks: helm lint --strict, strict Kubernetes schemas (kubernetes-validate, offline),
the Prometheus Operator CRD schemas (vendored), the values schema, checkov, hadolint, and the
shared rule and dashboard files reaching the render through the chart's symlinks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (CHART, CHECKOV, CI_VALUES, ROOT, docs, find, helm, min_kube_version, name, one,
                                render, render_text, template_args)

CRD_DIR = Path(__file__).parent / "schemas" / "prometheus-operator"
NEWEST_KUBE = "1.37.0"  # the newest version kubernetes-validate 1.37.0 bundles
sys.path.insert(0, str(ROOT / "deploy" / "helm"))
import gen_values_doc  # noqa: E402
import gen_values_schema  # noqa: E402


@pytest.mark.parametrize("ci_file", CI_VALUES)
@pytest.mark.parametrize("kube_version", [min_kube_version(), None])  # None: helm's own, 1.37 (deprecation lint)
def test_helm_lint_strict(ci_file: str, kube_version: str | None) -> None:
    args = ["lint", "--strict", str(CHART), "-f", str(CHART / "ci" / ci_file)]
    done = helm(*args, *(["--kube-version", kube_version] if kube_version else []))
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout


def test_helm_is_the_pinned_release() -> None:
    pinned = next(line.split(":=")[1].strip() for line in (ROOT / "Makefile").read_text().splitlines()
                  if line.startswith("HELM_VERSION"))
    assert helm("version", "--short").stdout.strip() == pinned


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of the vendored Prometheus Operator CRDs."""
    out = {}
    for path in CRD_DIR.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            out[(f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])] = \
                version["schema"]["openAPIV3Schema"]
    return out


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI schema with additionalProperties=false wherever properties are listed (the API server prunes
    unknown fields of a structural CRD; a typo would silently vanish, so the test refuses it)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def validate_crd(manifest: dict[str, Any], schema: dict[str, Any]) -> None:
    """Validate against an OpenAPI v3 CRD schema. The schema itself is not checked as JSON Schema: its
    patterns are Go regexps (e.g. a mid-pattern `(?i)`) that Python's re module does not compile."""
    jsonschema.Draft7Validator(strict(schema)).validate(manifest)


@pytest.mark.parametrize("ci_file", CI_VALUES)
@pytest.mark.parametrize("kube_version", [min_kube_version(), NEWEST_KUBE])
def test_rendered_manifests_pass_strict_schemas(ci_file: str, kube_version: str) -> None:
    crds = crd_schemas()
    manifests = render(ci_file)
    assert manifests
    for m in manifests:
        key = (m["apiVersion"], m["kind"])
        if key in crds:
            validate_crd(m, crds[key])
        else:
            kubernetes_validate.validate(m, kube_version, strict=True)


def test_metrics_render_has_the_operator_objects_checked_against_their_crds() -> None:
    manifests = render("metrics-values.yaml")
    monitor = one(manifests, "ServiceMonitor", "gregor")
    assert monitor["spec"]["selector"]["matchLabels"]["gregor.io/metrics"] == "true"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pod_monitor = one(render(None, "metrics.serviceMonitor.enabled=false", "metrics.podMonitor.enabled=true"),
                      "PodMonitor", "gregor")
    validate_crd(pod_monitor, crd_schemas()[("monitoring.coreos.com/v1", "PodMonitor")])
    # The target labels the rules and dashboards select on, as `gregor cluster up --prometheus` sets them.
    for endpoint in (monitor["spec"]["endpoints"][0], pod_monitor["spec"]["podMetricsEndpoints"][0]):
        assert endpoint["port"] == "metrics"
        labels = {r["targetLabel"]: r for r in endpoint["relabelings"]}
        assert labels["cluster"]["replacement"] == "gregor"
        assert labels["role"]["sourceLabels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]
        assert labels["id"]["sourceLabels"] == ["__meta_kubernetes_pod_label_apps_kubernetes_io_pod_index"]
    roles = {m["metadata"]["labels"]["app.kubernetes.io/component"] for m in manifests
             if m["kind"] == "Service" and m["metadata"]["labels"].get("gregor.io/metrics") == "true"}
    assert roles == {"etcd", "controller", "broker", "coordinator", "gateway"}  # cluster.json's role names
    bad = json.loads(json.dumps(monitor))
    bad["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(bad, crd_schemas()[("monitoring.coreos.com/v1", "ServiceMonitor")])


def test_a_wrong_field_fails_the_kubernetes_schema() -> None:
    sts = json.loads(json.dumps(one(render(), "StatefulSet", name("broker"))))
    sts["spec"]["replica"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, min_kube_version(), strict=True)


@pytest.mark.parametrize("sets, message", [
    (("brokers.replicas=three",), "/brokers/replicas"),
    (("metrics.enabled=yes",), "/metrics/enabled"),
    (("bogus=1",), "'bogus' not allowed"),
    (("brokers.replica=3",), "'replica' not allowed"),
    (("brokers.podAntiAffinityPreset=always",), "podAntiAffinityPreset"),
    (("externalEtcd.endpoints={etcd:2379}",), "externalEtcd/endpoints"),
    (("tls.enabled=true",), "set tls.existingSecret"),
    (("etcd.enabled=false",), "set externalEtcd.endpoints"),
    (("brokers.replicas=2",), "default.replication.factor (3) exceeds brokers.replicas (2)"),
    # Chart-written keys of a role's properties file (etcd.endpoints, cluster.id, bootstrap.servers).
    (("coordinators.config.etcd\\.endpoints=http://elsewhere:2379",), "/coordinators/config"),
    (("brokers.config.cluster\\.id=other",), "/brokers/config"),
    (("gateways.config.bootstrap\\.servers=elsewhere:9092",), "/gateways/config"),
])
def test_bad_values_are_refused_with_a_clear_message(sets: tuple[str, ...], message: str) -> None:
    done = helm(*template_args(CHART, sets=sets), check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_values_schema_is_what_the_generator_writes() -> None:
    assert (CHART / "values.schema.json").read_text() == gen_values_schema.render(), \
        "values.schema.json is stale: run `make chart-schema`"


def test_readme_documents_every_value() -> None:
    text = (CHART / "values.yaml").read_text()
    documented = {path for path, _ in gen_values_doc.documented_keys(text)}
    assert not gen_values_doc.undocumented_leaves(yaml.safe_load(text), documented)
    readme = (CHART / "README.md").read_text()
    assert readme == gen_values_doc.render(readme), "README values table is stale: run `make chart-docs`"
    for path in documented:
        assert f"| `{path}` |" in readme


def test_dockerfile_passes_hadolint_and_a_bad_one_does_not(tmp_path: Path) -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    ok = subprocess.run([str(hadolint), "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / "Dockerfile")],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install grpcio\nCMD python -m gregor.broker\n")
    done = subprocess.run([str(hadolint), "--config", str(ROOT / ".hadolint.yaml"), str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "DL3007" in done.stdout


def test_dockerfile_builds_with_the_commands_make_setup_runs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "RUN make setup" in dockerfile
    assert 'ENTRYPOINT ["/usr/bin/tini", "--"]' in dockerfile and "USER 10001" in dockerfile
    # The commands the chart starts are console scripts of the project, so the image has them.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    rendered = render_text()
    for script in ("gregor-broker", "gregor-controller", "gregor-coordinator", "gregor-gateway",
                   "gregor-broker-shutdown"):
        assert script in scripts and script in rendered


def checkov(files: list[Path], *extra: str) -> subprocess.CompletedProcess[str]:
    if not CHECKOV.exists():
        raise AssertionError(f"{CHECKOV} not found: run `make chart-tools`")
    args = [str(CHECKOV), "--config-file", str(ROOT / "deploy" / "helm" / "checkov.yaml"), *extra]
    for f in files:
        args += ["-f", str(f)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_checkov_finds_nothing_beyond_the_accepted_findings(tmp_path: Path) -> None:
    closed, open_ = [], []
    for ci_file in CI_VALUES:
        path = tmp_path / ci_file
        path.write_text(render_text(ci_file))
        policies = yaml.safe_load((CHART / "ci" / ci_file).read_text()).get("networkPolicy", {}).get("enabled")
        (closed if policies else open_).append(path)
    assert closed, "some ci/ file must run with the NetworkPolicies on"
    strict_run = checkov(closed)
    assert strict_run.returncode == 0, strict_run.stdout[-4000:]
    assert "Failed checks: 0" in strict_run.stdout
    # NETWORK_POLICY_OFF: without NetworkPolicies, CKV2_K8S_6 is the one more accepted finding (checkov.yaml).
    relaxed = checkov(open_, "--skip-check", "CKV_K8S_43,CKV_K8S_15,CKV2_K8S_6")
    assert relaxed.returncode == 0, relaxed.stdout[-4000:]


def test_checkov_fails_a_privileged_container(tmp_path: Path) -> None:
    """The policy check can fail: the same render with privilege escalation allowed does."""
    path = tmp_path / "bad.yaml"
    path.write_text(render_text("high-availability-values.yaml",
                                ("containerSecurityContext.allowPrivilegeEscalation=true",)))
    done = checkov([path])
    assert done.returncode != 0 and "CKV_K8S_20" in done.stdout


# -- the one rule file and the dashboards: deploy/prometheus and deploy/grafana through symlinks -------------

def test_the_chart_reads_the_shared_directories_through_symlinks() -> None:
    for link, target in (("prometheus", ROOT / "deploy" / "prometheus"), ("grafana", ROOT / "deploy" / "grafana")):
        path = CHART / "files" / link
        assert path.is_symlink(), f"files/{link} must link to deploy/{link}, not hold a copy"
        assert path.resolve() == target.resolve()


def shared_groups() -> list[str]:
    groups = []
    for path in sorted((ROOT / "deploy" / "prometheus").glob("*rules.y*ml")):
        groups += [g["name"] for g in yaml.safe_load(path.read_text()).get("groups") or []]
    return groups


def test_every_rule_group_and_dashboard_on_disk_is_rendered() -> None:
    manifests = render("metrics-values.yaml")
    rules = find(manifests, "PrometheusRule")
    groups = shared_groups()
    if groups:
        assert [g["name"] for g in one(manifests, "PrometheusRule", "gregor")["spec"]["groups"]] == groups
    else:
        assert not rules
    dashboards = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
    maps = {k: v for m in find(manifests, "ConfigMap") if m["metadata"]["labels"].get("grafana_dashboard") == "1"
            for k, v in m["data"].items()}
    assert sorted(maps) == [d.name for d in dashboards]
    for d in dashboards:
        assert json.loads(maps[d.name]) == json.loads(d.read_text())


RULES = """groups:
  - name: gregor-availability
    rules:
      - alert: GregorOfflinePartitions
        expr: max(gregor_controller_offline_partitions) > 0
        for: 1m
        labels: {severity: critical}
        annotations:
          summary: "{{ $value }} partitions have no leader ({{ $labels.instance }})"
  - name: gregor-replication
    rules:
      - alert: GregorUnderReplicatedPartitions
        expr: sum(gregor_broker_under_replicated_partitions) > 0
        for: 5m
"""


@pytest.fixture()
def chart_with_shared_files(tmp_path: Path) -> Path:
    """The chart with its symlinks, beside a deploy/prometheus and deploy/grafana of test files (not committed)."""
    chart = tmp_path / "deploy" / "helm" / "gregor"
    shutil.copytree(CHART, chart, symlinks=True)
    (tmp_path / "deploy" / "prometheus").mkdir(parents=True)
    (tmp_path / "deploy" / "prometheus" / "gregor-rules.yaml").write_text(RULES)
    (tmp_path / "deploy" / "prometheus" / "prometheus.yml").write_text("scrape_configs: []\n")  # not a rule file
    (tmp_path / "deploy" / "grafana").mkdir()
    for title in ("Gregor Overview", "Gregor Brokers"):
        (tmp_path / "deploy" / "grafana" / f"{title.lower().replace(' ', '-')}.json").write_text(
            json.dumps({"title": title, "panels": [{"type": "timeseries", "title": "p | \"q\""}]}, indent=2))
    return chart


def test_rule_groups_and_dashboards_follow_the_files(chart_with_shared_files: Path) -> None:
    values = str(CHART / "ci" / "metrics-values.yaml")
    manifests = docs(helm(*template_args(chart_with_shared_files, values)).stdout)
    [rule] = find(manifests, "PrometheusRule")
    assert [g["name"] for g in rule["spec"]["groups"]] == ["gregor-availability", "gregor-replication"]
    # Prometheus' own templating stays as written: Helm renders templates, not .Files contents.
    annotation = rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]
    assert annotation == "{{ $value }} partitions have no leader ({{ $labels.instance }})"
    validate_crd(rule, crd_schemas()[("monitoring.coreos.com/v1", "PrometheusRule")])
    dashboards = {m["metadata"]["name"]: m for m in find(manifests, "ConfigMap")
                  if m["metadata"]["labels"].get("grafana_dashboard") == "1"}
    assert sorted(dashboards) == ["gregor-dashboard-gregor-brokers", "gregor-dashboard-gregor-overview"]
    data = dashboards["gregor-dashboard-gregor-overview"]["data"]["gregor-overview.json"]
    assert json.loads(data)["title"] == "Gregor Overview"
    assert dashboards["gregor-dashboard-gregor-overview"]["metadata"]["annotations"]["grafana_folder"] == "Gregor"
    lint = helm("lint", "--strict", str(chart_with_shared_files), "-f", values, "--kube-version", min_kube_version())
    assert "0 chart(s) failed" in lint.stdout


def test_helm_package_carries_the_linked_files(chart_with_shared_files: Path, tmp_path: Path) -> None:
    out = tmp_path / "dist"
    helm("package", str(chart_with_shared_files), "--destination", str(out))
    [archive] = out.glob("gregor-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"gregor/files/prometheus/gregor-rules.yaml", "gregor/files/grafana/gregor-overview.json",
            "gregor/files/grafana/gregor-brokers.json", "gregor/values.schema.json"} <= names
    assert not any(n.startswith("gregor/ci/") for n in names)
    rendered = docs(helm("template", "gregor", str(archive), "--kube-version", min_kube_version(),
                         "--set", "metrics.prometheusRule.enabled=true").stdout)
    assert len(find(rendered, "PrometheusRule")) == 1


@pytest.mark.parametrize("ci_file", ["default-values.yaml", "high-availability-values.yaml",
                                     "external-etcd-values.yaml"])
def test_notes_tell_how_to_produce_and_consume(ci_file: str, tmp_path: Path) -> None:
    """NOTES.txt rendered through `tpl` (helm template leaves NOTES out; helm install needs a cluster)."""
    chart = tmp_path / "gregor"
    shutil.copytree(CHART, chart)  # linked directories copied as they are
    shutil.copy(CHART / "templates" / "NOTES.txt", chart / "NOTES.txt")
    (chart / "templates" / "notes-as-configmap.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n'
        'data:\n  notes: {{ tpl (.Files.Get "NOTES.txt") . | toJson }}\n')
    manifests = docs(helm(*template_args(chart, str(CHART / "ci" / ci_file))).stdout)
    notes = one(manifests, "ConfigMap", "notes")["data"]["notes"]
    assert "gregor produce orders --acks all" in notes and "gregor consume orders --from-beginning" in notes
    assert f"helm test {'gregor'} -n streaming" in notes
    assert "gregor-gateway.streaming.svc.cluster.local:9095" in notes
    if ci_file.startswith("high"):
        assert "--labels=gregor-client=true" in notes  # the client pod must pass the NetworkPolicies
    if ci_file.startswith("external"):
        assert "external: http://etcd-0.etcd.infra.svc.cluster.local:2379" in notes
