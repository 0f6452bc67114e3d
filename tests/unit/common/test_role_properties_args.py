"""Each role's CLI over a properties file: the file, then --override, then a flag given on the command line;
unknown or malformed keys stop the process with a message and exit status 2.

Roles never import each other; this test imports every role's parse_args because the contract is shared.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gregor.broker.__main__ import main as broker_main
from gregor.broker.__main__ import parse_args as broker_args
from gregor.controller.__main__ import parse_args as controller_args
from gregor.coordinator.__main__ import parse_args as coordinator_args
from gregor.gateway.__main__ import parse_args as gateway_args

ETCD = "http://e0:2379,http://e1:2379"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "server.properties"
    path.write_text(text)
    return str(path)


def config(tmp_path: Path, text: str) -> str:
    return f"--config={write(tmp_path, text)}"


def refused(parse: object, argv: list[str], capsys: pytest.CaptureFixture[str], message: str) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(argv)  # type: ignore[operator]
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_controller_reads_its_file_and_flags_override_it(tmp_path: Path) -> None:
    conf = write(tmp_path, f"etcd.endpoints={ETCD}\ncluster.id=prod\ndelete.topic.enable=false\n"
                           "leader.imbalance.per.broker.percentage=20\n")
    a = controller_args(["--controller-id=1", f"--config={conf}"])
    assert (a.etcd, a.cluster, a.delete_topic_enable) == (ETCD, "prod", False)
    assert a.leader_balance.leader_imbalance_per_broker_percentage == 20
    assert a.leader_balance.auto_leader_rebalance_enable is True  # the default, in neither
    a = controller_args(["--controller-id=1", f"--config={conf}", "--override=leader.imbalance.per.broker.percentage=30",
                         "--delete-topic-enable=true", "--etcd=http://flag:2379"])
    assert (a.etcd, a.delete_topic_enable, a.leader_balance.leader_imbalance_per_broker_percentage) == (
        "http://flag:2379", True, 30)
    # A flag beats an --override of the same key.
    a = controller_args(["--controller-id=1", f"--config={conf}", "--override=cluster.id=o", "--cluster=f"])
    assert a.cluster == "f"


def test_controller_election_lease_is_controller_quorum_fetch_timeout_ms(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """KRaft's controller.quorum.fetch.timeout.ms (2000) is the controller lease TTL; --lease-ttl-ms is its flag."""
    assert controller_args(["--controller-id=1", f"--etcd={ETCD}"]).lease_ttl_ms == 2000
    conf = write(tmp_path, f"etcd.endpoints={ETCD}\ncontroller.quorum.fetch.timeout.ms=3000\n")
    assert controller_args(["--controller-id=1", f"--config={conf}"]).lease_ttl_ms == 3000
    assert controller_args(["--controller-id=1", f"--config={conf}",
                            "--override=controller.quorum.fetch.timeout.ms=4000"]).lease_ttl_ms == 4000
    assert controller_args(["--controller-id=1", f"--config={conf}", "--lease-ttl-ms=5000"]).lease_ttl_ms == 5000
    refused(controller_args, ["--controller-id=1", f"--etcd={ETCD}", "--override=controller.quorum.fetch.timeout.ms=0"],
            capsys, "controller.quorum.fetch.timeout.ms (--lease-ttl-ms) must be positive")


def test_controller_fast_failover_is_on_by_default_and_can_be_turned_off(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """controller.fast.failover.enable (Gregor's own, default true): a standby revokes a provably dead active
    controller's lease; false leaves controller.quorum.fetch.timeout.ms's expiry the only path."""
    assert controller_args(["--controller-id=1", f"--etcd={ETCD}"]).fast_failover_enable is True
    conf = write(tmp_path, f"etcd.endpoints={ETCD}\ncontroller.fast.failover.enable=false\n")
    assert controller_args(["--controller-id=1", f"--config={conf}"]).fast_failover_enable is False
    assert controller_args(["--controller-id=1", f"--config={conf}",
                            "--fast-failover-enable=true"]).fast_failover_enable is True
    refused(controller_args, ["--controller-id=1", f"--etcd={ETCD}", "--override=controller.fast.failover.enable=1"],
            capsys, "controller.fast.failover.enable")


def test_controller_refuses_bad_keys_values_and_a_missing_etcd(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    refused(controller_args, ["--controller-id=1", config(tmp_path, f'etcd.endpoints={ETCD}\nbogus=1\n')],
            capsys, "Unknown controller configuration: bogus")
    refused(controller_args, ["--controller-id=1", config(tmp_path, 'delete.topic.enable=yes\n'),
                              f"--etcd={ETCD}"], capsys, "Invalid value 'yes' for configuration delete.topic.enable")
    refused(controller_args, ["--controller-id=1", config(tmp_path, 'a line\n')], capsys,
            "server.properties:1: expected KEY=VALUE")
    refused(controller_args, ["--controller-id=1", config(tmp_path, 'cluster.id=x\n')], capsys,
            "etcd.endpoints is required")
    refused(controller_args, ["--controller-id=1", f"--etcd={ETCD}", "--override=leader.imbalance.per.broker.percentage=101"],
            capsys, "between 0 and 100")


def test_coordinator_reads_its_file_and_overrides_go_over_it(tmp_path: Path) -> None:
    conf = write(tmp_path, f"etcd.endpoints={ETCD}\ncluster.id=prod\noffsets.topic.num.partitions=7\n"
                           "transaction.max.timeout.ms=60000\n")
    a = coordinator_args(["--coordinator-id=0", f"--config={conf}"])
    assert (a.etcd, a.cluster, a.config.offsets_topic_num_partitions, a.txn_config.max_timeout_ms) == (
        ETCD, "prod", 7, 60000)
    a = coordinator_args(["--coordinator-id=0", f"--config={conf}", "--override=offsets.topic.num.partitions=9",
                          "--cluster=other"])
    assert (a.config.offsets_topic_num_partitions, a.cluster) == (9, "other")


def test_coordinator_refuses_bad_keys_and_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = write(tmp_path, f"etcd.endpoints={ETCD}\noffsets.topic.bogus=1\n")
    refused(coordinator_args, ["--coordinator-id=0", f"--config={conf}"], capsys,
            "Unknown coordinator configuration: offsets.topic.bogus")
    refused(coordinator_args, ["--coordinator-id=0", f"--etcd={ETCD}", "--override=group.max.size=many"], capsys,
            "Invalid value 'many' for configuration group.max.size")
    refused(coordinator_args, ["--coordinator-id=0", f"--etcd={ETCD}", "--override=group.max.size=0"], capsys,
            "group.max.size=0: out of range")
    refused(coordinator_args, ["--coordinator-id=0", "--override=noequals"], capsys, "--override expects KEY=VALUE")


def test_gateway_reads_its_file_and_properties_go_over_it(tmp_path: Path) -> None:
    conf = write(tmp_path, "bootstrap.servers=b0:9092,b1:9092\ncompression.type=lz4\nlinger.ms=5\n")
    a = gateway_args([f"--config={conf}"])
    assert (a.bootstrap, a.props) == ("b0:9092,b1:9092", {"compression.type": "lz4", "linger.ms": "5"})
    a = gateway_args([f"--config={conf}", "--producer-property=linger.ms=9", "--bootstrap=flag:9092"])
    assert (a.bootstrap, a.props["linger.ms"]) == ("flag:9092", "9")


def test_gateway_refuses_unknown_producer_keys_before_starting(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    refused(gateway_args, [config(tmp_path, 'bootstrap.servers=b:9092\nlinger.mss=5\n')], capsys,
            "Unknown producer configuration 'linger.mss'")
    refused(gateway_args, [config(tmp_path, 'linger.ms=5\n')], capsys, "bootstrap.servers is required")
    refused(gateway_args, ["--bootstrap=b:9092", "--producer-property=oops"], capsys,
            "--producer-property expects KEY=VALUE")


def test_broker_override_goes_over_its_file_and_a_bad_line_exits_2(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    conf = write(tmp_path, f"etcd.endpoints={ETCD}\nnum.partitions=3\n")
    cfg, _ = broker_args([f"--config={conf}", f"--log-dirs={tmp_path}", "--override=num.partitions=5"])
    assert (cfg.etcd_endpoints, cfg.num_partitions) == (ETCD, 5)
    assert broker_main([config(tmp_path, 'num.partitions\n'), f"--log-dirs={tmp_path}"]) == 2
    assert "server.properties:1: expected KEY=VALUE" in capsys.readouterr().err


def test_every_role_takes_the_metrics_topic_keys_off_by_default(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    conf = config(tmp_path, f"etcd.endpoints={ETCD}\nmetrics.topic.enable=true\n")
    on = ["--override", "metrics.topic.interval.ms=250"]
    controller = controller_args(["--controller-id", "0", conf, *on]).metrics_topic
    coordinator = coordinator_args(["--coordinator-id", "0", conf, *on]).metrics_topic
    gateway = gateway_args(["--bootstrap", "b:1", "--producer-property", "metrics.topic.enable=true",
                            "--producer-property", "metrics.topic.interval.ms=250"])
    for m in (controller, coordinator, gateway.metrics_topic):
        assert (m.enable, m.interval_ms, m.replication_factor) == (True, 250, 1)
    assert "metrics.topic.enable" not in gateway.props  # the gateway's own key, not its producer's
    assert not controller_args(["--controller-id", "0", "--etcd", ETCD]).metrics_topic.enable
    assert not coordinator_args(["--coordinator-id", "0", "--etcd", ETCD]).metrics_topic.enable
    assert not gateway_args(["--bootstrap", "b:1"]).metrics_topic.enable
    refused(controller_args, ["--controller-id", "0", "--etcd", ETCD, "--override", "metrics.topic.interval.ms=0"],
            capsys, "metrics.topic.interval.ms=0: must be positive")
    refused(coordinator_args, ["--coordinator-id", "0", "--etcd", ETCD, "--override", "metrics.topic.enable=yes"],
            capsys, "metrics.topic.enable")
    refused(gateway_args, ["--bootstrap", "b:1", "--producer-property", "metrics.topic.interval.ms=soon"],
            capsys, "metrics.topic.interval.ms='soon': invalid value")
