"""The broker's LogCleaner over real native logs (no threads started: clean_filthiest is
driven by hand): which log it picks (cleanup.policy, min.cleanable.dirty.ratio,
max.compaction.lag.ms, the high-watermark bound) and the metrics it exports."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from gregor.broker.log_manager import LogManager
from gregor.common import errors, records
from gregor.common.clock import now_ms
from gregor.common.config import BrokerConfig, effective_topic_configs, log_config_kwargs


def manager(tmp_path: Path) -> LogManager:
    return LogManager(BrokerConfig(log_dirs=str(tmp_path)))


def fill(mgr: LogManager, topic: str, overrides: dict[str, str], n: int = 40) -> None:
    configs = effective_topic_configs({"segment.bytes": "500", **overrides})
    lg = mgr.get_or_create_log(topic, 0, configs)
    ts = now_ms()
    for i in range(n):
        lg.append_as_leader(records.build_batch([(b"k%d" % (i % 3), b"v%d" % i, [], ts)]), 0)
    lg.roll()


def sample(name: str) -> float:
    value = REGISTRY.get_sample_value(name)
    assert value is not None, name
    return value


def test_cleanup_policy_values_and_retention_of_compact_topics() -> None:
    for policy in ("compact", "compact,delete", "delete,compact", "delete"):
        assert effective_topic_configs({"cleanup.policy": policy})["cleanup.policy"] == policy
    with pytest.raises(errors.GregorError):
        effective_topic_configs({"cleanup.policy": "shred"})
    compact = log_config_kwargs(effective_topic_configs({"cleanup.policy": "compact", "retention.ms": "5"}))
    assert (compact["retention_ms"], compact["retention_bytes"]) == (-1, -1)
    both = log_config_kwargs(effective_topic_configs({"cleanup.policy": "compact,delete", "retention.ms": "5"}))
    assert both["retention_ms"] == 5
    cfg = BrokerConfig.from_properties({"log.cleaner.enable": "false", "log.cleaner.threads": "2",
                                        "log.cleaner.backoff.ms": "50", "log.cleaner.dedupe.buffer.size": "1000",
                                        "log.cleaner.max.compaction.lag.ms": "60000"})
    assert (cfg.log_cleaner_enable, cfg.log_cleaner_threads, cfg.log_cleaner_backoff_ms,
            cfg.log_cleaner_dedupe_buffer_size) == (False, 2, 50, 1000)
    assert cfg.topic_defaults["max.compaction.lag.ms"] == 60000


def test_cleaner_picks_the_dirtiest_compacted_log(tmp_path: Path) -> None:
    mgr = manager(tmp_path)
    fill(mgr, "plain", {"cleanup.policy": "delete"})
    fill(mgr, "table", {"cleanup.policy": "compact"})
    runs = sample("gregor_log_cleaner_runs_total")
    assert mgr.cleaner.clean_filthiest() is True
    assert sample("gregor_log_cleaner_runs_total") == runs + 1
    assert sample("gregor_log_cleaner_max_dirty_percent") == 100.0
    assert 0 < sample("gregor_log_cleaner_recopy_percent") < 100
    assert mgr.logs[("table", 0)].cleanable().dirty_bytes == 0
    assert mgr.logs[("plain", 0)].cleanable().dirty_ratio == 1.0  # never cleaned: cleanup.policy=delete
    assert mgr.cleaner.clean_filthiest() is False
    mgr.close()


def test_cleaner_waits_for_ratio_and_high_watermark_unless_max_lag_passed(tmp_path: Path) -> None:
    mgr = manager(tmp_path)
    fill(mgr, "table", {"cleanup.policy": "compact"})
    mgr.retention_upper_bound = lambda _key: 0  # high watermark 0: nothing is cleanable
    assert mgr.cleaner.clean_filthiest() is False
    mgr.retention_upper_bound = lambda _key: None
    mgr.update_config("table", effective_topic_configs({"cleanup.policy": "compact", "segment.bytes": "500",
                                                         "min.cleanable.dirty.ratio": "1.0"}))
    lg = mgr.logs[("table", 0)]
    lg.clean()  # all clean now; add a little dirt: below the ratio of 1.0
    lg.append_as_leader(records.build_batch([(b"k0", b"new", [], now_ms())]), 0)
    lg.roll()
    assert 0 < lg.cleanable().dirty_ratio < 1.0
    assert mgr.cleaner.clean_filthiest() is False
    # max.compaction.lag.ms forces it once the first dirty record is older than the lag.
    mgr.update_config("table", effective_topic_configs({"cleanup.policy": "compact", "segment.bytes": "500",
                                                         "min.cleanable.dirty.ratio": "1.0",
                                                         "max.compaction.lag.ms": "1"}))
    import time
    time.sleep(0.01)
    assert mgr.cleaner.clean_filthiest() is True
    assert lg.cleanable().dirty_bytes == 0
    mgr.close()
