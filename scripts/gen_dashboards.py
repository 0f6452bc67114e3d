"""Writes deploy/grafana/*.json, Gregor's Grafana dashboards, from the compact panel lists below.

The JSON files are what ships (the Helm chart's ConfigMaps, `gregor dashboards render`, the live
test in tests/e2e/test_dashboards_live.py); this script keeps their layout, variables, units and
thresholds uniform. Run it after editing a panel: `.venv/bin/python scripts/gen_dashboards.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "deploy" / "grafana"
SCHEMA_VERSION = 41  # Grafana 12's dashboard schema
C = 'cluster="$cluster"'
CI = 'cluster="$cluster", instance=~"$instance"'
RI = "$__rate_interval"

# Thresholds: (color, from) steps, first one from -inf.
GOOD_ZERO = [("green", None), ("red", 1)]
EXACTLY_ONE = [("red", None), ("green", 1), ("red", 2)]


def panel(title: str, exprs: list[tuple[str, str]], unit: str = "short", kind: str = "timeseries",
          thresholds: list[tuple[str, float | None]] | None = None, width: int = 12, desc: str = "") -> dict[str, Any]:
    """One panel; exprs are (PromQL, legend) pairs."""
    steps = [{"color": c, "value": v} for c, v in (thresholds or [("green", None)])]
    return {
        "type": kind, "title": title, "description": desc,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps},
                                     "color": {"mode": "thresholds" if kind == "stat" else "palette-classic"}},
                        "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}} if kind == "stat" else
                   {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [{"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": e, "legendFormat": lg,
                     "refId": chr(ord("A") + i), "range": True} for i, (e, lg) in enumerate(exprs)],
        "_width": width,
    }


def stat(title: str, expr: str, unit: str = "short", thresholds: list[tuple[str, float | None]] | None = None,
         desc: str = "") -> dict[str, Any]:
    return panel(title, [(expr, "")], unit, "stat", thresholds, width=4, desc=desc)


def variable(name: str, query: str, multi: bool = True) -> dict[str, Any]:
    return {"name": name, "label": name, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": f"{name}-var"}, "definition": query, "refresh": 2, "sort": 1,
            "multi": multi, "includeAll": multi, "allValue": ".*" if multi else None,
            "current": {"text": "All", "value": "$__all"} if multi else {}}


def dashboard(uid: str, title: str, panels: list[dict[str, Any]], extra_vars: list[dict[str, Any]]) -> dict[str, Any]:
    x = y = row_h = 0
    for i, p in enumerate(panels):
        w = p.pop("_width")
        h = 4 if p["type"] == "stat" else 8
        if x + w > 24:
            x, y = 0, y + row_h
            row_h = 0
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        p["id"] = i + 1
        x, row_h = x + w, max(row_h, h)
    variables = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1},
        variable("cluster", "label_values(gregor_build_info, cluster)", multi=False),
        variable("instance", 'label_values(up{cluster="$cluster"}, instance)'),
        *extra_vars,
    ]
    return {"uid": uid, "title": title, "tags": ["gregor"], "timezone": "browser", "editable": True,
            "schemaVersion": SCHEMA_VERSION, "version": 1, "refresh": "30s", "graphTooltip": 1,
            "time": {"from": "now-1h", "to": "now"}, "templating": {"list": variables},
            "annotations": {"list": []}, "links": [], "panels": panels}


TOPIC_VAR = variable("topic", 'label_values(gregor_broker_topic_bytes_in_total{cluster="$cluster"}, topic)')
GROUP_VAR = variable("group", 'label_values(gregor_coordinator_committed_offset{cluster="$cluster"}, group)')


def q99(metric: str, by: str, sel: str = C) -> str:
    return f"histogram_quantile(0.99, sum by ({by}le) (rate({metric}_bucket{{{sel}}}[{RI}])))"


DASHBOARDS: dict[str, tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = {
    "gregor-overview": ("Gregor / Cluster overview", [
        stat("Brokers online", f'count(up{{{C}, role="broker"}} == 1)'),
        stat("Active controllers", f"sum(gregor_controller_active_controller{{{C}}})", thresholds=EXACTLY_ONE),
        stat("Offline partitions", f"max(gregor_controller_offline_partitions{{{C}}})", thresholds=GOOD_ZERO),
        stat("Under-replicated partitions", f"sum(gregor_broker_under_replicated_partitions{{{C}}})",
             thresholds=GOOD_ZERO),
        stat("Under min ISR partitions", f"sum(gregor_broker_under_min_isr_partitions{{{C}}})", thresholds=GOOD_ZERO),
        stat("Partitions", f"max(gregor_controller_global_partitions{{{C}}})"),
        stat("Topics", f"max(gregor_controller_global_topics{{{C}}})"),
        stat("Bytes in", f"sum(gregor:topic_bytes_in:rate1m{{{C}}})", "Bps"),
        stat("Bytes out", f"sum(gregor:topic_bytes_out:rate1m{{{C}}})", "Bps"),
        stat("Messages in", f"sum(gregor:topic_messages_in:rate1m{{{C}}})", "short"),
        stat("Lowest log-dir free space", f"min(gregor:log_dir_free:ratio{{{C}}})", "percentunit",
             [("red", None), ("orange", 0.1), ("green", 0.2)]),
        stat("Targets down", f"count(up{{{C}}} == 0) or vector(0)", thresholds=GOOD_ZERO),
        panel("Requests by service", [(f"sum by (service) (rate(gregor_requests_total{{{C}}}[{RI}]))", "{{service}}")],
              "reqps"),
        panel("Request latency p99 by API", [(f"gregor:request_latency_seconds:p99_5m{{{C}}}", "{{service}}.{{api}}")],
              "s"),
        panel("Process CPU by role", [(f"sum by (role) (rate(process_cpu_seconds_total{{{C}}}[{RI}]))", "{{role}}")],
              "percentunit"),
        panel("Resident memory", [(f"process_resident_memory_bytes{{{CI}}}", "{{role}} {{instance}}")], "bytes"),
    ], []),
    "gregor-controller": ("Gregor / Controller", [
        stat("ControllerState (active)", f"max(gregor_controller_state * on (instance) "
             f"gregor_controller_active_controller{{{C}}})", desc="Kafka's ControllerState byte; 0 = Idle"),
        stat("Controller epoch", f"max(gregor_controller_epoch{{{C}}})"),
        stat("Offline partitions", f"max(gregor_controller_offline_partitions{{{C}}})", thresholds=GOOD_ZERO),
        stat("Preferred replica imbalance", f"max(gregor_controller_preferred_replica_imbalance{{{C}}})",
             thresholds=[("green", None), ("orange", 1)]),
        stat("Unclean elections (1h)", f"sum(increase(gregor_controller_unclean_leader_elections_total{{{C}}}[1h]))",
             thresholds=GOOD_ZERO),
        stat("Shutting-down brokers", f"max(gregor_controller_shutting_down_brokers{{{C}}})"),
        panel("Active controller", [(f"gregor_controller_active_controller{{{CI}}}", "{{instance}}")]),
        panel("Event rate by ControllerState",
              [(f"sum by (state) (rate(gregor_controller_state_rate_and_time_seconds_count{{{C}}}[{RI}]))",
                "{{state}}")], "ops"),
        panel("Event time p99 by ControllerState", [(q99("gregor_controller_state_rate_and_time_seconds", "state, "),
                                                     "{{state}}")], "s"),
        panel("Event queue size", [(f"gregor_controller_event_queue_size{{{CI}}}", "{{instance}}")],
              thresholds=[("green", None), ("red", 100)]),
        panel("Event queue time and processing time p99",
              [(f"gregor:controller_event_queue_time_seconds:p99_5m{{{C}}}", "queue time p99"),
               (q99("gregor_controller_event_processing_time_seconds", ""), "processing time p99")], "s"),
        panel("Leader elections by kind",
              [(f"sum by (kind) (increase(gregor_controller_leader_elections_total{{{C}}}[{RI}]))", "{{kind}}")]),
        panel("Channel-manager queue size per broker",
              [(f"gregor_controller_channel_queue_size{{{C}}}", "broker {{broker_id}}")]),
        panel("Channel-manager queue time p99 per broker",
              [(q99("gregor_controller_channel_queue_time_seconds", "broker_id, "), "broker {{broker_id}}")], "s"),
    ], []),
    "gregor-brokers": ("Gregor / Brokers and replication", [
        panel("Under-replicated partitions", [(f"gregor_broker_under_replicated_partitions{{{CI}}}", "{{instance}}")],
              thresholds=GOOD_ZERO, width=8),
        panel("Under / at min ISR", [(f"gregor_broker_under_min_isr_partitions{{{CI}}}", "under {{instance}}"),
                                     (f"gregor_broker_at_min_isr_partitions{{{CI}}}", "at {{instance}}")], width=8),
        panel("Offline replicas", [(f"gregor_broker_offline_replicas{{{CI}}}", "{{instance}}")], width=8),
        panel("Leaders and partitions", [(f"gregor_broker_leader_partitions{{{CI}}}", "leaders {{instance}}"),
                                         (f"gregor_broker_partitions{{{CI}}}", "replicas {{instance}}")]),
        panel("ISR shrinks / expands", [
            (f"sum by (instance) (rate(gregor_broker_isr_shrinks_total{{{CI}}}[{RI}]))", "shrinks {{instance}}"),
            (f"sum by (instance) (rate(gregor_broker_isr_expands_total{{{CI}}}[{RI}]))", "expands {{instance}}")],
              "ops"),
        panel("Max replica fetcher lag (records)",
              [(f"max by (instance) (gregor_broker_replica_fetcher_max_lag{{{CI}}})", "{{instance}}")]),
        panel("Broker requests by API", [(f'sum by (api) (rate(gregor_requests_total{{{C}, service="BrokerService"}}'
                                          f"[{RI}]))", "{{api}}")], "reqps"),
        panel("Broker requests by result code", [(f'sum by (code) (rate(gregor_requests_total{{{C}, '
                                                  f'service="BrokerService"}}[{RI}]))', "{{code}}")], "reqps"),
        panel("Total time p99 by API (TotalTimeMs)",
              [(f'gregor:request_latency_seconds:p99_5m{{{C}, service="BrokerService"}}', "{{api}}")], "s"),
        panel("Remote time p99 by API (purgatory wait, RemoteTimeMs)",
              [(q99("gregor_request_remote_time_seconds", "api, "), "{{api}}")], "s"),
        panel("Purgatory size", [(f"sum by (purgatory) (gregor_broker_purgatory_size{{{CI}}})", "{{purgatory}}")]),
        panel("Zero-copy bytes sent (data port)",
              [(f"sum by (instance) (rate(gregor_broker_zero_copy_bytes_total{{{CI}}}[{RI}]))", "{{instance}}")],
              "Bps"),
        panel("Log-dir free space", [(f"gregor_broker_log_dir_free_bytes{{{CI}}}", "{{instance}} {{dir}}")], "bytes"),
        panel("Log recovery time at start",
              [(f"gregor_broker_log_recovery_seconds_total{{{CI}}}", "{{instance}}")], "s"),
    ], []),
    "gregor-topics": ("Gregor / Topics", [
        panel("Bytes in per topic", [(f'gregor:topic_bytes_in:rate1m{{{C}, topic=~"$topic"}}', "{{topic}}")], "Bps"),
        panel("Bytes out per topic", [(f'gregor:topic_bytes_out:rate1m{{{C}, topic=~"$topic"}}', "{{topic}}")],
              "Bps"),
        panel("Messages in per topic", [(f'gregor:topic_messages_in:rate1m{{{C}, topic=~"$topic"}}', "{{topic}}")],
              "short"),
        panel("Log size per topic (all replicas)",
              [(f'sum by (topic) (gregor_log_size_bytes{{{C}, topic=~"$topic"}})', "{{topic}}")], "bytes"),
        panel("Log segments per topic", [(f'sum by (topic) (gregor_log_segments{{{C}, topic=~"$topic"}})',
                                          "{{topic}}")]),
        panel("Leaders' high watermark (sum over partitions)",
              [(f'sum by (topic) (gregor_broker_leader_high_watermark{{{C}, topic=~"$topic"}})', "{{topic}}")]),
        panel("Log start / end offset (sum over replicas)",
              [(f'sum by (topic) (gregor_log_start_offset{{{C}, topic=~"$topic"}})', "start {{topic}}"),
               (f'sum by (topic) (gregor_log_end_offset{{{C}, topic=~"$topic"}})', "end {{topic}}")]),
    ], [TOPIC_VAR]),
    "gregor-consumer-groups": ("Gregor / Consumer groups and lag", [
        panel("Consumer lag per group and topic",
              [(f'gregor:consumergroup_lag:sum{{{C}, group=~"$group"}}', "{{group}} {{topic}}")],
              thresholds=[("green", None), ("orange", 1000)], width=24),
        panel("Committed offset per partition",
              [(f'gregor_coordinator_committed_offset{{{C}, group=~"$group"}}', "{{group}} {{topic}}-{{partition}}")]),
        panel("Groups by state", [(f"sum by (state) (gregor_coordinator_groups{{{C}}})", "{{state}}")]),
        panel("Members", [(f"sum(gregor_coordinator_members{{{C}}})", "members")]),
        panel("Rebalances", [(f"sum(rate(gregor_coordinator_rebalances_total{{{C}}}[{RI}]))", "rebalances")], "ops"),
        panel("Rebalance duration p99", [(q99("gregor_coordinator_rebalance_duration_seconds", ""), "p99")], "s"),
        panel("Offset commits", [(f"sum(rate(gregor_coordinator_offset_commits_total{{{C}}}[{RI}]))", "commits")],
              "ops"),
    ], [GROUP_VAR]),
    "gregor-gateway": ("Gregor / Producer gateway", [
        panel("Records in / out", [
            (f"sum by (instance) (rate(gregor_gateway_records_in_total{{{CI}}}[{RI}]))", "in {{instance}}"),
            (f"sum by (instance) (rate(gregor_gateway_records_out_total{{{CI}}}[{RI}]))", "acked {{instance}}")],
              "ops"),
        panel("Batches in", [(f"sum by (instance) (rate(gregor_gateway_batches_in_total{{{CI}}}[{RI}]))",
                              "{{instance}}")], "ops"),
        panel("Records per batch p50 / p99", [
            (f"histogram_quantile(0.5, sum by (le) (rate(gregor_gateway_records_per_batch_bucket{{{CI}}}[{RI}])))",
             "p50"), (q99("gregor_gateway_records_per_batch", "", CI), "p99")]),
        panel("Batch size p50 / p99", [
            (f"histogram_quantile(0.5, sum by (le) (rate(gregor_gateway_batch_size_bytes_bucket{{{CI}}}[{RI}])))",
             "p50"), (q99("gregor_gateway_batch_size_bytes", "", CI), "p99")], "bytes"),
        panel("Record latency p99", [(q99("gregor_gateway_record_latency_seconds", "instance, ", CI),
                                      "{{instance}}")], "s"),
        panel("Compression ratio (encoded / raw)", [(f"gregor_gateway_compression_ratio{{{CI}}}", "{{instance}}")],
              "percentunit"),
        panel("Buffer used (buffer.memory)", [
            (f"gregor_gateway_buffer_bytes{{{CI}}} / gregor_gateway_buffer_memory_bytes{{{CI}}}", "{{instance}}")],
              "percentunit", thresholds=[("green", None), ("orange", 0.7), ("red", 0.9)]),
        panel("Retries and errors by code", [
            (f"sum(rate(gregor_gateway_retries_total{{{CI}}}[{RI}]))", "retries"),
            (f"sum by (code) (rate(gregor_gateway_record_errors_total{{{CI}}}[{RI}]))", "{{code}}")], "ops"),
    ], []),
    "gregor-etcd": ("Gregor / etcd", [
        stat("etcd members with a leader", f'sum(etcd_server_has_leader{{{C}, role="etcd"}})'),
        stat("Leader changes (1h)", f'sum(increase(etcd_server_leader_changes_seen_total{{{C}}}[1h]))',
             thresholds=[("green", None), ("orange", 1)]),
        stat("Lease keep-alive failures (1h)",
             f"sum(increase(gregor_etcd_lease_keepalive_failures_total{{{C}}}[1h]))", thresholds=GOOD_ZERO),
        stat("Endpoint failovers (1h)", f"sum(increase(gregor_etcd_endpoint_failovers_total{{{C}}}[1h]))"),
        panel("Gregor's etcd request latency p99 by method",
              [(q99("gregor_etcd_request_duration_seconds", "method, "), "{{method}}")], "s"),
        panel("Gregor's etcd requests by role", [
            (f"sum by (role) (rate(gregor_etcd_request_duration_seconds_count{{{C}}}[{RI}]))", "{{role}}")], "reqps"),
        panel("WAL fsync p99", [(q99("etcd_disk_wal_fsync_duration_seconds", "instance, "), "{{instance}}")], "s"),
        panel("Backend commit p99", [(q99("etcd_disk_backend_commit_duration_seconds", "instance, "),
                                      "{{instance}}")], "s"),
        panel("Proposals committed", [(f"sum by (instance) (rate(etcd_server_proposals_committed_total{{{C}}}[{RI}]))",
                                       "{{instance}}")], "ops"),
        panel("DB size", [(f"etcd_mvcc_db_total_size_in_bytes{{{C}}}", "{{instance}}")], "bytes"),
    ], []),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for uid, (title, panels, extra) in DASHBOARDS.items():
        path = OUT / f"{uid.removeprefix('gregor-')}.json"
        path.write_text(json.dumps(dashboard(uid, title, panels, extra), indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
