"""The kind chaos pipeline, checked against a real Kubernetes API server on a machine without Docker.

kube-apiserver (built from the Go module proxy by `make kube-tools`) runs on its own etcd; Chaos Mesh's
CRDs from its pinned Go module are applied to it; then every experiment and Job the pipeline submits
is created there with strict field validation (the API server checks them against the CRDs' schemas
and the built-in types), the chart is installed into it with the real helm, and the pipeline script's
dry run names every file it applies. Nothing runs pods here: there is no scheduler or kubelet.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.helpers.cluster import etcd_process
from tests.helpers.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
KUBE_APISERVER = ROOT / ".tools" / "bin" / "kube-apiserver"
HELM = ROOT / ".tools" / "bin" / "helm"
CHAOS_CRDS = ROOT / ".tools" / "chaos-mesh-crd.yaml"
CHAOS_DIR = ROOT / "deploy" / "kind" / "chaos"
TOKEN = "gregor-test-token"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Api:
    """A tiny client of the API server's REST interface (bearer token; its self-signed serving cert)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
                return resp.status, self._body(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, self._body(exc.read())

    @staticmethod
    def _body(raw: bytes) -> Any:
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {"text": raw.decode(errors="replace")}

    def create(self, obj: dict[str, Any]) -> tuple[int, Any]:
        """POST obj where it belongs, with fieldValidation=Strict (unknown fields are errors)."""
        api_version, kind = obj["apiVersion"], obj["kind"]
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        plural = {"PersistentVolumeClaim": "persistentvolumeclaims", "Job": "jobs", "Namespace": "namespaces",
                  "CustomResourceDefinition": "customresourcedefinitions"}.get(kind, kind.lower())
        ns = obj.get("metadata", {}).get("namespace")
        path = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
        return self.call("POST", path + "?fieldValidation=Strict", obj)


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    assert KUBE_APISERVER.exists(), "run `make kube-tools` (make test does) to build kube-apiserver"
    d = tmp_path_factory.mktemp("kube")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (d / "sa.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
    (d / "sa.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                             serialization.PublicFormat.SubjectPublicKeyInfo))
    (d / "tokens.csv").write_text(f'{TOKEN},admin,admin,"system:masters"\n')
    with etcd_process(str(d / "etcd")) as etcd:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = open(d / "apiserver.log", "w")
        proc = subprocess.Popen([
            str(KUBE_APISERVER), f"--etcd-servers=http://{etcd.grpc}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", f"--cert-dir={d / 'certs'}", f"--token-auth-file={d / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}", f"--service-account-signing-key-file={d / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--enable-priority-and-fairness=false",
            "--disable-admission-plugins=ServiceAccount"], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
        api = Api(f"https://127.0.0.1:{port}")
        try:
            def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"kube-apiserver exited: {(d / 'apiserver.log').read_text()[-3000:]}")
                try:
                    return api.call("GET", "/readyz")[0] == 200
                except OSError:
                    return False
            wait_for(ready, 120, "kube-apiserver ready", interval_s=0.5)
            kubeconfig = d / "kubeconfig"
            kubeconfig.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "test",
                "clusters": [{"name": "test", "cluster": {"server": api.base, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "admin", "user": {"token": TOKEN}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}]}))
            api.kubeconfig = kubeconfig  # type: ignore[attr-defined]
            yield api
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()


@pytest.fixture(scope="module")
def chaos_crds(apiserver: Api) -> Api:
    assert CHAOS_CRDS.exists(), "run `make kube-tools` (make test does) to fetch Chaos Mesh's CRDs"
    crds = [doc for doc in yaml.load_all(CHAOS_CRDS.read_text(), Loader=LOADER) if doc]
    for crd in crds:
        code, body = apiserver.create(crd)
        assert code in (201, 409), body
    names = [c["metadata"]["name"] for c in crds]

    def established() -> bool:
        for name in names:
            code, body = apiserver.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = {c["type"]: c["status"] for c in body.get("status", {}).get("conditions", [])}
            if conds.get("Established") != "True":
                return False
        return True
    wait_for(established, 60, "Chaos Mesh CRDs established")
    code, body = apiserver.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gregor"}})
    assert code in (201, 409), body
    return apiserver


def experiments() -> list[Path]:
    return sorted((CHAOS_DIR / "experiments").glob("*.yaml"))


def test_the_pipeline_covers_every_chaos_mesh_fault_kind_the_issue_names() -> None:
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in experiments()}
    assert {"PodChaos", "NetworkChaos", "TimeChaos", "IOChaos", "StressChaos"} <= kinds


@pytest.mark.parametrize("path", experiments(), ids=lambda p: p.stem)
def test_each_experiment_is_accepted_by_the_api_server(chaos_crds: Api, path: Path) -> None:
    code, body = chaos_crds.create(yaml.safe_load(path.read_text()))
    assert code == 201, body


def test_an_invalid_experiment_is_refused(chaos_crds: Api) -> None:
    """The validation is real: a PodChaos with an unknown action or field is refused."""
    bad = yaml.safe_load((CHAOS_DIR / "experiments" / "01-gregor-broker-kill.yaml").read_text())
    bad["metadata"]["name"] = "broken"
    bad["spec"]["action"] = "explode"
    code, body = chaos_crds.create(bad)
    assert code == 422 and "explode" in json.dumps(body), body
    bad["spec"]["action"] = "pod-kill"
    bad["spec"]["blastRadius"] = 3
    code, body = chaos_crds.create(bad)
    assert code in (400, 422) and "blastRadius" in json.dumps(body), body


def test_the_workload_and_checker_jobs_are_accepted(chaos_crds: Api) -> None:
    for doc in yaml.safe_load_all((CHAOS_DIR / "jobs.yaml").read_text()):
        code, body = chaos_crds.create(doc)
        assert code == 201, body


def test_the_chart_installs_into_the_api_server(chaos_crds: Api, tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(chaos_crds.kubeconfig), "HELM_CACHE_HOME": str(tmp_path / "cache"),  # type: ignore[attr-defined]
           "HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_DATA_HOME": str(tmp_path / "data")}
    r = subprocess.run([str(HELM), "install", "gregor", str(ROOT / "deploy" / "helm" / "gregor"), "--namespace",
                        "gregor", "--set", "image.tag=0.1.0", "--timeout", "2m"], capture_output=True, text=True,
                       env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    code, body = chaos_crds.call("GET", "/apis/apps/v1/namespaces/gregor/statefulsets/gregor-broker")
    assert code == 200 and body["spec"]["replicas"] == 3, body
    r = subprocess.run([str(HELM), "status", "gregor", "--namespace", "gregor", "-o", "json"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["info"]["status"] == "deployed", r.stderr


def _make_var(name: str) -> str:
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith(f"{name} :="):
            return line.split(":=", 1)[1].strip()
    raise AssertionError(f"{name} not in the Makefile")


def test_the_validated_crds_are_those_of_the_chaos_mesh_the_pipeline_installs() -> None:
    """The CRDs the experiments are validated against (fetched by `make kube-tools`) are the release the
    script installs: the checksum the Makefile checks them by is of CHAOS_MESH_VERSION's manifests/crd.yaml,
    and the script (alone or through `make chaos-kind`) installs that chart version."""
    import hashlib

    assert CHAOS_CRDS.exists(), "run `make kube-tools` (make test does) to fetch Chaos Mesh's CRDs"
    assert hashlib.sha256(CHAOS_CRDS.read_bytes()).hexdigest() == _make_var("CHAOS_MESH_CRD_SHA256")
    version = _make_var("CHAOS_MESH_VERSION")
    env = {k: v for k, v in os.environ.items() if k != "CHAOS_MESH_VERSION"}
    r = subprocess.run(["bash", str(ROOT / "deploy" / "kind" / "chaos-kind.sh")], capture_output=True, text=True,
                       env={**env, "DRY_RUN": "1"}, timeout=60)
    assert r.returncode == 0, r.stderr
    installs = [line for line in r.stdout.splitlines() if " upgrade --install chaos-mesh " in line]
    assert len(installs) == 1 and f"--version {version} " in installs[0], r.stdout


def test_the_pipeline_script_dry_run_applies_every_experiment_and_both_jobs() -> None:
    r = subprocess.run(["bash", str(ROOT / "deploy" / "kind" / "chaos-kind.sh")], capture_output=True, text=True,
                       env={**os.environ, "DRY_RUN": "1"}, timeout=60)
    assert r.returncode == 0, r.stderr
    applied = [line.split(" -f ")[1] for line in r.stdout.splitlines() if " apply -f " in line]
    assert [Path(a.split()[0]).name for a in applied if "experiments" in a] == [p.name for p in experiments()]
    assert sum("jobs.yaml" in a for a in applied) == 2
    assert "job/gregor-chaos-check" in r.stdout
