"""LogManager retention never deletes at or above the high watermark the ReplicaManager reports."""

from __future__ import annotations

from gregor.broker.log_manager import LogManager
from gregor.common.config import BrokerConfig, effective_topic_configs
from tests.helpers.batches import make_batch


async def test_retention_is_bounded_by_the_high_watermark(tmp_path) -> None:
    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    configs = effective_topic_configs({"retention.ms": "1000", "segment.bytes": "200"})
    log = manager.get_or_create_log("old", 0, configs)
    for i in range(5):  # year-2001 timestamps: every segment is long expired
        log.append_as_leader(make_batch([f"v{i}".encode()], timestamp_ms=1_000_000_000_000), 0)
    assert log.num_segments >= 3
    hw = {"value": 0}
    manager.retention_upper_bound = lambda key: hw["value"]
    assert await manager.cleanup_logs() == 0, "nothing is below HW 0"
    assert log.log_start_offset == 0
    hw["value"] = 3
    await manager.cleanup_logs()
    assert 0 < log.log_start_offset <= 3, "deletes only segments wholly below the HW"
    assert log.log_end_offset == 5
    manager.close()
