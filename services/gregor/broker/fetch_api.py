"""The Fetch request in and out of the domain, shared by its two transports: gRPC Fetch and the zero-copy data port.

Both hand a FetchRequest to ReplicaManager.handle_fetch (DelayedFetch included) and
build the FetchResponse from its FetchResult; only how the records travel differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gregor.rpc.v1 import broker_pb2

if TYPE_CHECKING:
    from gregor.broker.replica_manager import FetchResult, ReplicaManager


async def handle_fetch_request(replicas: "ReplicaManager", request: broker_pb2.FetchRequest) -> "FetchResult":
    """A FetchRequest through the ReplicaManager; shared by gRPC Fetch and the zero-copy data port."""
    return await replicas.handle_fetch(
        request.topic, request.partition, request.fetch_offset, request.max_bytes, request.min_bytes,
        request.max_wait_ms, request.replica_id if request.HasField("replica_id") else -1,
        request.current_leader_epoch if request.HasField("current_leader_epoch") else -1,
        # A broker epoch is an etcd creation revision (>= 1); 0 means the follower sent none.
        replica_broker_epoch=request.replica_broker_epoch if request.replica_broker_epoch > 0 else -1,
        isolation_level=int(request.isolation_level), topic_id=request.topic_id)


def fetch_response(result: "FetchResult", records: bytes = b"", throttle_time_ms: int = 0) -> broker_pb2.FetchResponse:
    """The FetchResponse of a result; the data port sends the records raw after it, so it passes none."""
    return broker_pb2.FetchResponse(
        high_watermark=result.high_watermark, last_stable_offset=result.last_stable_offset,
        log_start_offset=result.log_start_offset, records=records, leader_epoch=result.leader_epoch,
        aborted_transactions=[broker_pb2.AbortedTransaction(producer_id=pid, first_offset=first)
                              for pid, first in result.aborted_transactions], throttle_time_ms=throttle_time_ms)
