"""Kafka-protocol admin steps the e2e suites share (confluent-kafka against Gregor's Kafka listeners)."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers.wait import wait_for


def create_topic_everywhere(bootstrap: str, name: str, partitions: int, rf: int,
                            config: dict[str, str] | None = None, wait_s: float = 60.0) -> str:
    """CreateTopics through `bootstrap`, then wait until every listener in it shows every partition with a leader
    and its full ISR: metadata reaches each broker asynchronously (UpdateMetadata), as in Kafka."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf,
                                           config=config or {})]).values():
        assert f.result(timeout=wait_s) is None
    for address in bootstrap.split(","):
        one = AdminClient({"bootstrap.servers": address})

        def ready() -> bool:
            t = one.list_topics(name, timeout=10).topics.get(name)
            return t is not None and t.error is None and len(t.partitions) == partitions and \
                all(p.leader >= 0 and len(p.isrs) == rf for p in t.partitions.values())
        wait_for(ready, wait_s, f"{name} in {address}'s metadata with leaders and a full ISR")
    return name
