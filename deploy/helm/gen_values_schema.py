"""Write deploy/helm/gregor/values.schema.json: the chart's values schema (Draft 7, as Helm checks it).

Kept as code because the five roles share most of their keys: one definition of a role's
scheduling, resources and PDB keys serves all of them. `make chart-schema` rewrites the file;
tests/deploy checks that the committed file equals what this script writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CHART = Path(__file__).resolve().parent / "gregor"

STR: dict[str, Any] = {"type": "string"}
BOOL: dict[str, Any] = {"type": "boolean"}
OBJ: dict[str, Any] = {"type": "object"}
ARR: dict[str, Any] = {"type": "array"}
PORT: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": 65535}
COUNT: dict[str, Any] = {"type": "integer", "minimum": 0}
POSITIVE: dict[str, Any] = {"type": "integer", "minimum": 1}
SCALAR = {"type": ["string", "number", "boolean"]}
QUANTITY = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?([EPTGMK]i?|[mkMGTPE])?$"}
PRESETS = ["none", "nano", "micro", "small", "medium", "large", "xlarge"]


def closed(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """An object that refuses keys it does not know (a typo is an error, not a silent default)."""
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props, **extra}
    if required:
        out["required"] = required
    return out


def persistence(default_path: bool = False) -> dict[str, Any]:
    props = {"enabled": BOOL, "storageClass": STR, "accessModes": {"type": "array", "items": STR, "minItems": 1},
             "size": QUANTITY}
    if default_path:
        props["mountPath"] = {"type": "string", "pattern": "^/"}
    return closed(props)


def role(ports: dict[str, Any], min_replicas: int = 0, **extra: dict[str, Any]) -> dict[str, Any]:
    """The keys every role shares, plus its own."""
    props: dict[str, Any] = {
        "replicas": {"type": "integer", "minimum": min_replicas},
        "ports": closed(ports),
        "resourcesPreset": {"type": "string", "enum": PRESETS},
        "resources": OBJ,
        "podAntiAffinityPreset": {"type": "string", "enum": ["", "soft", "hard"]},
        "affinity": OBJ,
        "nodeSelector": {"type": "object", "additionalProperties": STR},
        "tolerations": ARR,
        "topologySpreadConstraints": ARR,
        "podAnnotations": {"type": "object", "additionalProperties": STR},
        "podLabels": {"type": "object", "additionalProperties": STR},
        "priorityClassName": STR,
        "terminationGracePeriodSeconds": COUNT,
        "pdb": closed({"create": BOOL, "maxUnavailable": {"type": ["integer", "string"]}}),
        **extra,
    }
    return closed(props, required=["replicas"])


def gregor_role(ports: dict[str, Any], min_replicas: int = 0, **extra: dict[str, Any]) -> dict[str, Any]:
    return role(ports, min_replicas, logLevel={"type": "string", "enum": ["DEBUG", "INFO", "WARNING", "ERROR"]},
                extraEnv=ARR, **extra)


# Keys the chart writes into every etcd-using role's properties file itself (from etcd/externalEtcd, clusterName).
ETCD_OWNED = ["etcd.endpoints", "cluster.id"]


def kafka_config(keys: list[str] | None = None, owned: list[str] | None = None) -> dict[str, Any]:
    """Kafka-style settings written to the role's properties file: key -> scalar; with `keys`, only those keys;
    `owned` keys are the chart's own (refused here, and by the template)."""
    if keys is None:
        out: dict[str, Any] = {"type": "object", "additionalProperties": SCALAR,
                               "propertyNames": {"pattern": r"^[a-z][a-z0-9.]*$"}}
        if owned:  # `false`: helm names the key in its message (a propertyNames `not` gets a wrong path)
            out["properties"] = {k: False for k in owned}
        return out
    return closed({k: SCALAR for k in keys})


def schema() -> dict[str, Any]:
    probe = closed({"enabled": BOOL, "periodSeconds": POSITIVE, "timeoutSeconds": POSITIVE,
                    "failureThreshold": POSITIVE})
    monitor = closed({"enabled": BOOL, "namespace": STR, "labels": OBJ, "interval": STR, "scrapeTimeout": STR})
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Values of the Gregor Helm chart",
        **closed({
            "nameOverride": STR,
            "fullnameOverride": STR,
            "commonLabels": {"type": "object", "additionalProperties": STR},
            "clusterName": {"type": "string", "pattern": "^[a-zA-Z0-9._-]+$"},
            "clusterDomain": {"type": "string", "minLength": 1},
            "image": closed({"registry": STR, "repository": {"type": "string", "minLength": 1}, "tag": STR,
                             "digest": {"type": "string", "pattern": "^(sha256:[a-f0-9]{64})?$"},
                             "pullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]}}),
            "imagePullSecrets": ARR,
            "serviceAccount": closed({"create": BOOL, "name": STR, "annotations": OBJ,
                                      "automountServiceAccountToken": BOOL}),
            "podSecurityContext": OBJ,
            "containerSecurityContext": OBJ,
            "topologySpread": closed({"enabled": BOOL, "topologyKey": STR, "maxSkew": POSITIVE,
                                      "whenUnsatisfiable": {"type": "string",
                                                            "enum": ["ScheduleAnyway", "DoNotSchedule"]}}),
            "tls": closed({"enabled": BOOL, "existingSecret": STR, "mountPath": STR,
                           "clientAuth": {"type": "string", "enum": ["required", "requested", "none"]},
                           "certManager": closed({"enabled": BOOL, "issuerRef": OBJ, "duration": STR,
                                                  "renewBefore": STR})}),
            "etcd": role({"client": PORT, "peer": PORT, "metrics": PORT}, min_replicas=1,
                         enabled=BOOL,
                         image=closed({"registry": STR, "repository": STR, "tag": STR,
                                       "pullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]}}),
                         autoCompactionRetention=STR, quotaBackendBytes=POSITIVE, persistence=persistence()),
            "externalEtcd": closed({"endpoints": {"type": "array",
                                                  "items": {"type": "string", "pattern": "^https?://[^,]+$"}}}),
            "controllers": gregor_role({"grpc": PORT}, leaseTtlMs=POSITIVE, config=kafka_config(
                ["delete.topic.enable", "auto.leader.rebalance.enable", "leader.imbalance.per.broker.percentage",
                 "leader.imbalance.check.interval.seconds"])),
            "brokers": gregor_role({"grpc": PORT, "data": PORT, "kafka": PORT}, min_replicas=1,
                                   rack=closed({"enabled": BOOL, "topologyLabel": STR}),
                                   kafkaListener=closed({"enabled": BOOL}),
                                   config=kafka_config(owned=ETCD_OWNED),
                                   persistence=persistence(default_path=True),
                                   service=closed({"type": {"type": "string",
                                                            "enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                                                   "annotations": OBJ}),
                                   preStop=closed({"enabled": BOOL}), raiseOpenFileLimit=BOOL),
            # Open: `gregor-coordinator --config` owns its key list (group.*, offsets.*, transaction.*) and
            # refuses an unknown key at start; tests/deploy runs its parser over the rendered properties file.
            "coordinators": gregor_role({"grpc": PORT}, leaseTtlMs=POSITIVE, config=kafka_config(owned=ETCD_OWNED)),
            # Open likewise: the producer config refuses unknown keys when `gregor-gateway --config` parses it.
            "gateways": gregor_role({"grpc": PORT}, config=kafka_config(owned=["bootstrap.servers"]),
                                    service=closed({"type": {"type": "string",
                                                             "enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                                                    "annotations": OBJ}),
                                    autoscaling=closed({"enabled": BOOL, "minReplicas": POSITIVE,
                                                        "maxReplicas": POSITIVE,
                                                        "targetCPUUtilizationPercentage": {
                                                            "type": "integer", "minimum": 1, "maximum": 100}})),
            "probes": closed({"liveness": probe, "readiness": probe, "startup": probe}),
            "metrics": closed({
                "enabled": BOOL, "port": PORT, "https": BOOL,
                "tlsConfig": closed({"serverName": STR, "insecureSkipVerify": BOOL}),
                "serviceMonitor": monitor,
                "podMonitor": closed({"enabled": BOOL, "namespace": STR, "labels": OBJ, "interval": STR}),
                "prometheusRule": closed({"enabled": BOOL, "namespace": STR, "labels": OBJ}),
                "grafanaDashboards": closed({"enabled": BOOL, "namespace": STR,
                                             "labels": {"type": "object", "additionalProperties": STR},
                                             "annotations": OBJ}),
            }),
            "networkPolicy": closed({"enabled": BOOL, "allowExternal": BOOL, "metricsFrom": ARR}),
            "tests": closed({"records": POSITIVE, "timeoutSeconds": POSITIVE}),
        }),
    }


def render() -> str:
    return json.dumps(schema(), indent=2) + "\n"


if __name__ == "__main__":
    out = CHART / "values.schema.json"
    out.write_text(render())
    print(f"wrote {out}", file=sys.stderr)
