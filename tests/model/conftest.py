"""tests/model: the producer contract over every facade and Hypothesis state machines against a real cluster.

Hypothesis profiles: `ci` (the default, what `make test` runs: a few examples of short programs, the whole
directory within ~3 minutes on the shared CI machine) and `long` (20x the examples: GREGOR_MODEL_PROFILE=long,
`make test-model-long`). Cluster examples are slow and their timing is the machine's, so no deadline and no
too_slow health check. The example database stays out of the repository (.hypothesis/ is git-ignored).
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers.cluster import LocalCluster, tear_down
from tests.integration.test_transactions import TXN_OVERRIDES

CI_EXAMPLES = 4
CI_STEPS = 12
settings.register_profile("ci", max_examples=CI_EXAMPLES, stateful_step_count=CI_STEPS, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much], print_blob=True,
                          report_multiple_bugs=False)
settings.register_profile("long", parent=settings.get_profile("ci"), max_examples=20 * CI_EXAMPLES)
PROFILE = os.environ.get("GREGOR_MODEL_PROFILE", "ci")
MODEL_SETTINGS = settings.get_profile(PROFILE)


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """etcd, a controller, 3 brokers, a coordinator and a producer gateway, shared by tests/model."""
    c = LocalCluster.up(str(tmp_path_factory.mktemp("model")), brokers=3, controllers=1, coordinators=1,
                        gateways=1, lease_ttl_ms=3000, coordinator_overrides=TXN_OVERRIDES,
                        broker_overrides={"replica.lag.time.max.ms": "3000"})
    try:
        yield c
    finally:
        tear_down(c)
