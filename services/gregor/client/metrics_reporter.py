"""Moved to gregor.common.metrics_reporter (shared by the roles); this name goes once the coordinator imports it there."""

from gregor.common.metrics_reporter import METRICS_TOPIC_KEYS, MetricsReporter, MetricsTopicConfig, etcd_bootstrap

__all__ = ["METRICS_TOPIC_KEYS", "MetricsReporter", "MetricsTopicConfig", "etcd_bootstrap"]
