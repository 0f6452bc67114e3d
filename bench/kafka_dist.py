"""Apache Kafka as a baseline: pinned jars from Maven Central and KRaft clusters on loopback.

Why: every claim that Gregor beats Kafka is measured against a real Kafka started on the same
machine in the same run (issue 15). Nothing is downloaded from anywhere but Maven Central, through
the ordinary client (`mvn dependency:copy-dependencies` on a generated pom), into a cache that
survives between runs.

API
---
``KAFKA_VERSION``                the pinned Apache Kafka release (``org.apache.kafka:kafka_2.13``).
``ensure_kafka(version=..., cache_dir=None) -> KafkaDist``
    Fetches ``kafka_2.13``, ``kafka-tools`` (perf tools, TopicCommand), ``kafka-clients`` and a log
    backend (log4j2 through ``log4j-slf4j2-impl``) into ``~/.cache/gregor/kafka/<version>/libs``
    (``$GREGOR_CACHE`` overrides ``~/.cache/gregor``) once; later calls only read the cache.
    Raises ``KafkaError`` with Maven's output when the fetch fails or ``java``/``mvn`` is missing.
``spark_kafka_jars(spark_version) -> list[str]``
    Spark's own Kafka source and sink (``spark-sql-kafka-0-10_2.13`` of that Spark version) and its runtime
    deps (kafka-clients, commons-pool2, the token provider) in ``~/.cache/gregor/spark-kafka/<version>/libs``,
    fetched the same way; the jar paths to pass as ``spark.jars``, less what pyspark already ships.
``python bench/kafka_dist.py [--spark]`` (``make kafka-jars``) fills both caches, so tests and benchmarks
    on a fresh machine find them; a no-op once cached.
``KafkaDist``: ``.version``, ``.lib_dir``, ``.classpath``;
    ``.command(main_class, *args, heap="256m", jvm_opts=()) -> list[str]`` a ``java -cp`` command;
    ``.run(main_class, *args, timeout=..., heap=...) -> CompletedProcess`` runs one to completion
    (stdout and stderr captured as text). Main classes used by the bench: ``kafka.Kafka`` (server),
    ``PRODUCER_PERF`` / ``CONSUMER_PERF`` / ``END_TO_END_LATENCY`` / ``TOPIC_COMMAND`` below.
``KafkaCluster(dist, base_dir, brokers=1, heap="1G", overrides=None)``
    ``brokers=1`` (default) is one combined node (``process.roles=broker,controller``);
    ``brokers=N > 1`` is one dedicated controller plus N brokers. ``overrides`` are
    server.properties entries applied to every broker (e.g. ``{"min.insync.replicas": "2"}``).
    ``.start()`` formats the storage directories (fresh cluster id) and starts the JVMs, waiting
    until every broker is registered; ``.stop()`` SIGTERMs then SIGKILLs them; also a context
    manager. ``.bootstrap`` is ``host:port,...`` of the brokers.
    ``.create_topic(name, partitions=1, replication_factor=1, configs=None)`` through
    ``kafka-topics`` (TopicCommand), retried while brokers are still registering.
    ``.pids`` (every server JVM, controller included), ``.cpu_seconds()`` (user + system so far,
    summed from /proc), ``.rss_bytes()`` and ``.peak_rss_bytes()`` (VmHWM summed).

Defaults are Kafka's except what a loopback benchmark needs: ``-Xmx/-Xms`` = ``heap`` (Kafka's
start script uses 1G), internal topics with RF min(3, brokers), ``group.initial.rebalance.delay.ms=0``
(the default exists for restarts of whole groups, and only adds 3 s to each consumer run here).
``GROUP_SETTINGS`` holds that setting for the Gregor side of every bench that runs groups on both systems
(its group coordinator has Kafka's 3 s default too).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from gregor.cli.local_cluster import free_port  # the same loopback port picker as Gregor's local clusters

# Both systems start an empty group's first rebalance at once (see the module docstring).
GROUP_SETTINGS = {"group.initial.rebalance.delay.ms": "0"}
KAFKA_VERSION = "4.4.0"  # the release issue 15 compared against
SCALA_BINARY = "2.13"
LOG4J_VERSION = "2.24.3"  # log4j2 line Kafka 4.x ships with; any 2.24+ reads the config below
SLF4J_VERSION = "2.0.17"  # the 2.x API log4j-slf4j2-impl binds to (a transitive dep pins 1.7, which logs nothing)
FETCH_TIMEOUT_S = 900  # first Maven fetch of ~100 jars on a slow link
START_TIMEOUT_S = 120  # a cold JVM broker on a loaded 2-core machine registers well within this
STOP_TIMEOUT_S = 30  # controlled shutdown of a broker moving leadership away
TOOL_TIMEOUT_S = 120  # one TopicCommand JVM

PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"
END_TO_END_LATENCY = "org.apache.kafka.tools.EndToEndLatency"
TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
SERVER_MAIN = "kafka.Kafka"
STORAGE_MAIN = "kafka.tools.StorageTool"

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>gregor.bench</groupId>
  <artifactId>kafka-baseline</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_{scala}</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-clients</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>{slf4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.server.name = org.apache.kafka.server
logger.server.level = INFO
"""

_TOOLS_LOG4J2 = """status = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = err
"""


class KafkaError(RuntimeError):
    """Kafka could not be fetched, started or driven; the message says why (with the tool's output)."""


def cache_root() -> Path:
    return Path(os.environ.get("GREGOR_CACHE", Path.home() / ".cache" / "gregor"))


@dataclass
class KafkaDist:
    """A fetched Kafka: its jars in lib_dir, runnable with `java -cp`."""

    version: str
    lib_dir: Path

    @property
    def classpath(self) -> str:
        return os.pathsep.join(str(p) for p in sorted(self.lib_dir.glob("*.jar")))

    @property
    def tools_log4j(self) -> Path:
        path = self.lib_dir.parent / "tools-log4j2.properties"
        if not path.exists():
            path.write_text(_TOOLS_LOG4J2)
        return path

    def command(self, main_class: str, *args: str, heap: str = "256m", jvm_opts: tuple[str, ...] = (),
                log4j: Optional[Path] = None) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise KafkaError("java not found on PATH: install a JDK 17+ (Debian: openjdk-17-jre-headless)")
        return [java, f"-Xmx{heap}", f"-Xms{heap}",
                "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
                "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={log4j or self.tools_log4j}",
                *jvm_opts, "-cp", self.classpath, main_class, *args]

    def run(self, main_class: str, *args: str, timeout: float = TOOL_TIMEOUT_S, heap: str = "256m",
            check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.command(main_class, *args, heap=heap), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise KafkaError(f"{main_class} {' '.join(args)} exited with {proc.returncode}:\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        return proc


def ensure_kafka(version: str = KAFKA_VERSION, cache_dir: Optional[Path] = None) -> KafkaDist:
    """The jars of Kafka `version` in the cache, fetched from Maven Central on first use."""
    home = (cache_dir or cache_root() / "kafka") / version
    lib_dir = home / "libs"
    marker = home / "complete"
    if marker.exists():
        return KafkaDist(version, lib_dir)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaError("mvn not found on PATH: install Maven (Debian: maven) to fetch Kafka from Maven Central")
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(_POM.format(scala=SCALA_BINARY, kafka=version, log4j=LOG4J_VERSION, slf4j=SLF4J_VERSION))
    if lib_dir.exists():
        shutil.rmtree(lib_dir)
    cmd = [mvn, "-B", "-q", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={lib_dir}", "-DincludeScope=runtime"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True, timeout=FETCH_TIMEOUT_S)
    if proc.returncode != 0 or not any(lib_dir.glob(f"kafka_{SCALA_BINARY}-{version}.jar")):
        raise KafkaError(f"fetching Kafka {version} from Maven Central failed ({' '.join(cmd)}):\n"
                         f"{proc.stdout[-4000:]}")
    marker.write_text(f"{version}\n")
    return KafkaDist(version, lib_dir)


_SPARK_KAFKA_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>gregor.bench</groupId><artifactId>spark-kafka</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_2.13</artifactId>
      <version>{spark}</version></dependency>
  </dependencies>
</project>
"""


def spark_kafka_jars(spark_version: str, cache_dir: Optional[Path] = None) -> list[str]:
    """spark-sql-kafka-0-10 and its runtime deps (kafka-clients, commons-pool2, token provider) from Maven
    Central through mvn, cached; Spark's own jars are `provided` there and come from pyspark."""
    home = (cache_dir or cache_root() / "spark-kafka") / spark_version
    libs = home / "libs"
    if not (home / "complete").exists():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaError("mvn not found on PATH: install Maven (Debian: maven) to fetch spark-sql-kafka-0-10")
        home.mkdir(parents=True, exist_ok=True)
        (home / "pom.xml").write_text(_SPARK_KAFKA_POM.format(spark=spark_version))
        shutil.rmtree(libs, ignore_errors=True)
        cmd = [mvn, "-B", "-q", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
               f"-DoutputDirectory={libs}", "-DincludeScope=runtime"]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              text=True, timeout=FETCH_TIMEOUT_S)
        if proc.returncode != 0 or not any(libs.glob("spark-sql-kafka-0-10_*.jar")):
            raise KafkaError(f"fetching spark-sql-kafka-0-10 {spark_version} from Maven Central failed "
                             f"({' '.join(cmd)}):\n{proc.stdout[-4000:]}")
        (home / "complete").write_text(spark_version)
    # Leave out what pyspark already ships (scala-library, slf4j, lz4, snappy, spark-tags, ...): two
    # versions of one library on the classpath is a conflict, not a dependency.
    import re

    import pyspark

    artifact = re.compile(r"^(.*?)-\d[\w.\-]*\.jar$")
    shipped = {artifact.sub(r"\1", p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(str(p) for p in libs.glob("*.jar") if artifact.sub(r"\1", p.name) not in shipped)


def _cluster_id() -> str:
    """A Kafka Uuid: 16 random bytes, URL-safe base64 without padding (what `kafka-storage random-uuid` prints).
    Like Kafka's Uuid.randomUuid, never one starting with "-": kafka-storage's argument parser would take it
    for an option (`-t -ps...` failed one run in 64)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass
class _Node:
    node_id: int
    roles: str
    directory: Path
    port: int  # PLAINTEXT (0 for a dedicated controller)
    controller_port: int  # CONTROLLER (0 for a pure broker)
    proc: Optional[subprocess.Popen[bytes]] = None


@dataclass
class KafkaCluster:
    """A KRaft cluster on loopback: one combined node, or one controller and `brokers` brokers."""

    dist: KafkaDist
    base_dir: Path
    brokers: int = 1
    heap: str = "1G"
    controllers: int = 1  # dedicated KRaft controllers (quorum voters) when brokers > 1
    controller_heap: str = ""  # their heap ("" = heap)
    overrides: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    nodes: list[_Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.brokers < 1:
            raise KafkaError("need at least one broker")
        self.base_dir = Path(self.base_dir)

    # ------------------------------------------------------------ layout
    def _plan(self) -> None:
        if self.brokers == 1:
            self.nodes = [_Node(1, "broker,controller", self.base_dir / "node-1", free_port(self.host),
                                free_port(self.host))]
        else:
            self.nodes = [_Node(100 + i, "controller", self.base_dir / f"controller-{100 + i}", 0, free_port(self.host))
                          for i in range(self.controllers)]
            self.nodes += [_Node(i, "broker", self.base_dir / f"broker-{i}", free_port(self.host), 0)
                           for i in range(1, self.brokers + 1)]

    def _properties(self, node: _Node) -> str:
        voters = ",".join(f"{n.node_id}@{self.host}:{n.controller_port}" for n in self.nodes if n.controller_port)
        listeners, advertised = [], []
        if node.port:
            listeners.append(f"PLAINTEXT://{self.host}:{node.port}")
            advertised.append(f"PLAINTEXT://{self.host}:{node.port}")
        if node.controller_port:
            listeners.append(f"CONTROLLER://{self.host}:{node.controller_port}")
        internal_rf = str(min(3, self.brokers))
        props = {
            "process.roles": node.roles, "node.id": str(node.node_id), "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER", "listeners": ",".join(listeners),
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT", "log.dirs": str(node.directory / "data"),
            "offsets.topic.replication.factor": internal_rf, "transaction.state.log.replication.factor": internal_rf,
            "transaction.state.log.min.isr": str(min(2, self.brokers)), "share.coordinator.state.topic.replication.factor": internal_rf,
            "share.coordinator.state.topic.min.isr": str(min(2, self.brokers)),
            **GROUP_SETTINGS, "num.partitions": "1",
        }
        if advertised:
            props["advertised.listeners"] = ",".join(advertised)
        if "broker" in node.roles:
            props.update(self.overrides)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "KafkaCluster":
        if self.nodes and any(n.proc and n.proc.poll() is None for n in self.nodes):
            raise KafkaError("cluster already running")
        self._plan()
        cluster_id = _cluster_id()
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
            (node.directory / "server.properties").write_text(self._properties(node))
            (node.directory / "log4j2.properties").write_text(_LOG4J2)
            self.dist.run(STORAGE_MAIN, "format", "-t", cluster_id, "-c", str(node.directory / "server.properties"),
                          "--ignore-formatted")
        try:
            for node in self.nodes:  # controllers first: brokers register with them
                self.start_node(node)
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, node: _Node) -> None:
        """Launch one node's JVM (again, after stop_node: same directory, same ports)."""
        log = open(node.directory / "stdout.log", "ab")
        heap = self.controller_heap if node.roles == "controller" and self.controller_heap else self.heap
        cmd = self.dist.command(SERVER_MAIN, str(node.directory / "server.properties"), heap=heap,
                                jvm_opts=(f"-Dkafka.logs.dir={node.directory / 'logs'}",),
                                log4j=node.directory / "log4j2.properties")
        node.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()

    def stop_node(self, node: _Node, sig: int = signal.SIGTERM) -> None:
        """Signal one node and wait for it to exit (SIGKILL after STOP_TIMEOUT_S)."""
        if node.proc is None or node.proc.poll() is not None:
            return
        node.proc.send_signal(sig)
        try:
            node.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait()

    def _wait_registered(self) -> None:
        """Until every broker answers on its port and the controller lists all of them (kafka-broker-api-versions)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        for node in self.nodes:
            while node.port:
                self._check_alive()
                try:
                    socket.create_connection((self.host, node.port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise KafkaError(f"broker {node.node_id} not listening within {START_TIMEOUT_S} s; "
                                         f"see {node.directory / 'logs' / 'server.log'}")
                    time.sleep(0.2)
        while True:  # registration: a create-topic probe with RF = brokers needs all of them
            proc = self.dist.run(TOPIC_COMMAND, "--bootstrap-server", self.bootstrap, "--describe", "--topic",
                                 "__gregor_probe", check=False)
            if "Topic:" in proc.stdout or "does not exist" in proc.stdout + proc.stderr:
                return
            self._check_alive()
            if time.monotonic() > deadline:
                raise KafkaError(f"cluster did not answer within {START_TIMEOUT_S} s:\n{proc.stderr[-2000:]}")
            time.sleep(0.5)

    def _check_alive(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is not None:
                tail = (node.directory / "stdout.log").read_text(errors="replace")[-3000:]
                raise KafkaError(f"Kafka node {node.node_id} exited with {node.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM brokers then the controller (controlled shutdown), SIGKILL after STOP_TIMEOUT_S."""
        for node in sorted(self.nodes, key=lambda n: "controller" == n.roles):
            if node.proc is None or node.proc.poll() is not None:
                continue
            node.proc.send_signal(signal.SIGTERM)
            try:
                node.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ use
    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{n.port}" for n in self.nodes if n.port)

    @property
    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     configs: Optional[dict[str, str]] = None) -> None:
        args = ["--bootstrap-server", self.bootstrap, "--create", "--topic", name, "--partitions", str(partitions),
                "--replication-factor", str(replication_factor)]
        for k, v in (configs or {}).items():
            args += ["--config", f"{k}={v}"]
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            proc = self.dist.run(TOPIC_COMMAND, *args, check=False)
            if proc.returncode == 0:
                return
            if "InvalidReplicationFactor" not in proc.stderr + proc.stdout or time.monotonic() > deadline:
                raise KafkaError(f"creating topic {name} failed:\n{proc.stdout[-1000:]}\n{proc.stderr[-2000:]}")
            time.sleep(1.0)  # brokers still registering with the controller

    def cpu_seconds(self) -> float:
        return sum(proc_cpu_seconds(pid) for pid in self.pids)

    def rss_bytes(self) -> int:
        return sum(proc_status_kib(pid, "VmRSS") * 1024 for pid in self.pids)

    def peak_rss_bytes(self) -> int:
        return sum(proc_status_kib(pid, "VmHWM") * 1024 for pid in self.pids)


# ---------------------------------------------------------------- /proc readers (shared with the Gregor side)
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (all threads) from /proc/<pid>/stat in seconds; zeros if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all threads) from /proc/<pid>/stat; 0 if it is gone."""
    return sum(_proc_times(pid))


def proc_system_seconds(pid: int) -> float:
    """stime alone: the kernel's part of proc_cpu_seconds (page cache, writeback, sockets)."""
    return _proc_times(pid)[1]


def proc_status_kib(pid: int, key: str) -> int:
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM); 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    """`make kafka-jars`: fill the caches the Java-tool tests, the Spark Kafka test and the benchmarks read."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--spark", action="store_true", help="also spark-sql-kafka-0-10 for the installed pyspark")
    args = ap.parse_args()
    t0 = time.monotonic()
    dist = ensure_kafka()
    print(f"Kafka {dist.version}: {dist.lib_dir} ({len(list(dist.lib_dir.glob('*.jar')))} jars)")
    if args.spark:
        import pyspark

        jars = spark_kafka_jars(pyspark.__version__)
        print(f"spark-sql-kafka-0-10 {pyspark.__version__}: {len(jars)} jars beside pyspark's")
    print(f"in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
