"""Client pieces that decide how fast a producer follows a new leader (pure logic, no network).

- the accumulator wakes the sender whenever a batch is created (Kafka's newBatchCreated), so an
  idle sender does not sleep its 1 s idle poll before sending it;
- a NOT_LEADER_OR_FOLLOWER naming a newer leader moves the partition at once (KIP-951), and an
  older Metadata answer does not move it back;
- metadata refreshes are spaced by retry.backoff.ms (Kafka's refresh backoff).
"""

from __future__ import annotations

import time

from gregor.client.accumulator import RecordAccumulator
from gregor.client.metadata import ClusterMetadata
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2, common_pb2


def metadata_response(leader: int, epoch: int) -> broker_pb2.MetadataResponse:
    return broker_pb2.MetadataResponse(
        brokers=[common_pb2.BrokerEndpoint(broker_id=i, host="127.0.0.1", grpc_port=9000 + i) for i in (1, 2, 3)],
        topics=[broker_pb2.TopicMetadata(name="t", partitions=[broker_pb2.PartitionMetadata(
            partition=0, leader=leader, leader_epoch=epoch, replicas=[1, 2, 3], isr=[1, 2, 3])])])


async def test_a_new_batch_wakes_the_sender_even_with_linger() -> None:
    acc = RecordAccumulator(batch_size=1000, linger_ms=50, buffer_memory=10_000, max_block_ms=200,
                            delivery_timeout_ms=60_000, retry_backoff_ms=100)
    acc.wakeup.clear()
    size = acc.record_size(None, b"x", [])
    acc.try_append("t", 0, None, b"x", [], 1000, size)
    assert acc.wakeup.is_set(), "a new batch must wake an idle sender (it computes the linger deadline)"
    acc.wakeup.clear()
    acc.try_append("t", 0, None, b"y", [], 1000, size)
    assert not acc.wakeup.is_set(), "a record joining an open, lingering batch does not"


async def test_leader_hint_moves_the_partition_and_older_answers_do_not_move_it_back() -> None:
    md = ClusterMetadata(["127.0.0.1:1"])
    md._apply(metadata_response(leader=1, epoch=4))
    assert md.leader_for("t", 0) == 1 and not md.stale

    hint = errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "moved", topic="t", partition=0,
                            leader_id=2, leader_epoch=5)
    md.request_update(hint)
    assert md.leader_for("t", 0) == 2 and md.partition("t", 0).leader_epoch == 5  # type: ignore[union-attr]
    assert md.stale, "a full refresh is still wanted"

    md._apply(metadata_response(leader=1, epoch=4))  # a broker that has not heard of epoch 5 yet
    assert md.leader_for("t", 0) == 2
    time.sleep(0.002)
    assert md.stale, "an answer older than the hint is not trusted: ask again"

    md._apply(metadata_response(leader=3, epoch=6))  # the cluster moved on: metadata wins again
    assert md.leader_for("t", 0) == 3 and not md.stale

    older = errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "old news", topic="t", partition=0,
                             leader_id=1, leader_epoch=5)
    md.request_update(older)
    assert md.leader_for("t", 0) == 3, "a hint older than what we know is ignored"
    await md.close()


async def test_a_hint_for_an_unknown_broker_is_ignored() -> None:
    md = ClusterMetadata(["127.0.0.1:1"])
    md._apply(metadata_response(leader=1, epoch=4))
    md.request_update(errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "moved", topic="t", partition=0,
                                       leader_id=9, leader_epoch=5))
    assert md.leader_for("t", 0) == 1 and md.stale
    await md.close()


def test_refreshes_are_spaced_by_retry_backoff() -> None:
    md = ClusterMetadata(["127.0.0.1:1"], retry_backoff_ms=100)
    now = time.monotonic()
    assert md.refresh_backoff_left(now) == 0.0
    md._refreshed_at = now
    assert 0.09 < md.refresh_backoff_left(now + 0.005) <= 0.1
    assert md.refresh_backoff_left(now + 0.1) == 0.0


