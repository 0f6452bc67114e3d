"""A client bootstrapping against a broker that has not yet heard from the controller.

A broker just (re)started answers Metadata from an empty cache (no live brokers, its topics unknown) until
the controller's first UpdateMetadata reaches it. Kafka's client ignores a Metadata answer without brokers
and asks another node (DefaultMetadataUpdater: "Ignoring empty metadata response"); Gregor's applied it and
forgot every broker it knew, so its next refresh had only the bootstrap list, whose addresses a rolling
restart on new ports had made stale: a producer of the TLS rotation test saw "no broker answered" for
60 s. Real processes: etcd, a controller (paused, so no UpdateMetadata reaches the restarted broker) and
two brokers."""

from __future__ import annotations

import os
import signal

from gregor.cli.local_cluster import start_broker, stop_process
from gregor.client import AdminClient
from gregor.client.metadata import ClusterMetadata
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc
from tests.helpers.cluster import running_cluster
from tests.helpers.wait import until


async def test_an_answer_without_brokers_is_skipped_for_the_next_broker(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with running_cluster(str(tmp_path / "c"), brokers=2, controllers=1) as cluster:
        first, second = cluster.by_role("broker")
        async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
            async def created() -> bool:
                try:
                    await admin.create_topic("t", 1, 2, {})
                    return True
                except errors.GregorError as exc:  # until the controller has seen the second broker register
                    assert exc.code == errors.Code.INVALID_REPLICATION_FACTOR, exc
                    return False

            await until(created, 30, "t created at RF 2")

            async def both_in_isr() -> bool:
                try:
                    return sorted((await admin.describe_topics(["t"]))["t"].partitions[0].isr) == [0, 1]
                except errors.UnknownTopicOrPartitionError:  # type: ignore[attr-defined]  # not propagated yet
                    return False

            await until(both_in_isr, 30, "t's ISR full")
        port = int(first.grpc.rsplit(":", 1)[1])
        stop_process(first, signal.SIGTERM)  # controlled shutdown: it leaves the ISR and etcd

        async def second_knows_it_alone_leads() -> bool:  # the controller's UpdateMetadata reached the second
            async with channel(second.grpc) as ch:
                md = await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(
                    broker_pb2.MetadataRequest(topics=["t"]), timeout=5)
            return [b.broker_id for b in md.brokers] == [1] and md.topics[0].partitions[0].leader == 1

        await until(second_knows_it_alone_leads, 30, "the second broker's metadata without the first")
        [controller] = cluster.by_role("controller")
        os.kill(controller.pid, signal.SIGSTOP)  # no UpdateMetadata for the broker coming back
        try:
            back = start_broker(first.data_dir.rsplit("/", 1)[0], first.id, port=port,
                                etcd_endpoint=cluster.etcd_endpoints)
            cluster.processes = [p for p in cluster.processes if p.pid != first.pid] + [back]
            md = ClusterMetadata([back.grpc, second.grpc], request_timeout_ms=5000)
            try:
                await md.refresh(["t"])
                assert set(md.brokers) == {1}, md.brokers  # the second broker's answer, not the empty one
                assert md.leader_for("t", 0) == 1
            finally:
                await md.close()
        finally:
            os.kill(controller.pid, signal.SIGCONT)
