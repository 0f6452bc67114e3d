"""Shared layer below every role: config, errors, metrics, records, etcd."""
