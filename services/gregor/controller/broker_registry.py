"""Broker registrations in etcd as the controller reads them: `brokers/ids/<id>` keys, epochs and endpoints."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gregor.common.etcd import EtcdClient, KeyValue
from gregor.common.etcd_layout import BrokerIdsZNode
from gregor.rpc.v1 import common_pb2


@dataclass(frozen=True)
class BrokerRegistration:
    """A `brokers/ids/<id>` key: the broker epoch is its creation revision; `info` its JSON value."""

    broker_id: int
    broker_epoch: int
    info: dict[str, object]

    def endpoint(self) -> common_pb2.BrokerEndpoint:
        info = self.info
        return common_pb2.BrokerEndpoint(
            broker_id=self.broker_id, broker_epoch=self.broker_epoch, host=str(info.get("host", "")),
            grpc_port=int(info.get("grpc_port", 0) or 0),  # type: ignore[call-overload]
            data_port=int(info.get("data_port", 0) or 0),  # type: ignore[call-overload]
            rack=str(info.get("rack", "") or ""))


@dataclass(frozen=True)
class ClusterDescription:
    controller_id: int
    controller_epoch: int
    brokers: list[BrokerRegistration]


def broker_id_of(etcd: EtcdClient, key: bytes) -> int | None:
    return BrokerIdsZNode.broker_id(etcd, key)


def registrations(etcd: EtcdClient, kvs: Sequence[KeyValue]) -> list[BrokerRegistration]:
    """Every well-formed registration among brokers/ids keys; a value that is not JSON leaves `info` empty."""
    out = []
    for kv in kvs:
        broker_id = broker_id_of(etcd, kv.key)
        if broker_id is None:
            continue
        out.append(BrokerRegistration(broker_id, kv.create_revision, BrokerIdsZNode.decode(kv.value)))
    return out


def broker_epochs(etcd: EtcdClient, kvs: Sequence[KeyValue]) -> dict[int, int]:
    """{broker id: broker epoch} from brokers/ids keys; the epoch is the key's creation revision."""
    return {r.broker_id: r.broker_epoch for r in registrations(etcd, kvs)}


def open_file_limits(registered: Iterable[BrokerRegistration]) -> dict[int, int]:
    """Each broker's open-file limit (`ulimit -n`) from its registration; brokers that did not say are left out."""
    out: dict[int, int] = {}
    for r in registered:
        value = r.info.get("max_open_files")
        if isinstance(value, int) and value > 0:
            out[r.broker_id] = value
    return out
