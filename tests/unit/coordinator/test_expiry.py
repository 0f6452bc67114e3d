"""offsets.retention: which groups expire (KIP-211; standalone groups by their last commit)."""

from __future__ import annotations

from gregor.coordinator.group_manager import GroupConfig, GroupManager


async def test_standalone_group_that_keeps_committing_does_not_expire() -> None:
    m = GroupManager(GroupConfig(initial_rebalance_delay_ms=0))
    m.validate_offset_commit("simple", -1, "", "", 0)
    m.validate_offset_commit("idle", -1, "", "", 0)
    m.validate_offset_commit("simple", -1, "", "", 900)  # a later commit restarts its retention
    assert [g.group_id for g in m.expired_groups(1000, 600)] == ["idle"]
    assert sorted(g.group_id for g in m.expired_groups(1500, 600)) == ["idle", "simple"]


def test_retention_settings_parse() -> None:
    from gregor.coordinator.__main__ import parse_args

    base = ["--coordinator-id", "0", "--etcd", "http://127.0.0.1:2379"]
    d = parse_args(base).config
    assert (d.offsets_retention_ms, d.offsets_retention_check_interval_ms, d.offsets_commit_timeout_ms) == (
        10080 * 60000, 600000, 5000)
    c = parse_args(base + ["--override", "offsets.retention.minutes=2",
                           "--override", "offsets.retention.check.interval.ms=300"]).config
    assert (c.offsets_retention_ms, c.offsets_retention_check_interval_ms) == (120000, 300)
    t = parse_args(base + ["--override", "offsets.retention.minutes=2", "--override", "offsets.retention.ms=1500",
                           "--override", "offsets.commit.timeout.ms=700"]).config
    assert (t.offsets_retention_ms, t.offsets_commit_timeout_ms) == (1500, 700)
