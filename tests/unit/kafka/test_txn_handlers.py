"""Pure parts of the Kafka listener's transaction APIs: error codes by request version."""

from __future__ import annotations

from gregor.kafka.codec import RequestHeader
from gregor.kafka.txn_handlers import INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, TXN_SUPPORTED, versioned


def test_producer_fenced_is_invalid_producer_epoch_for_versions_before_kip_588() -> None:
    for api, first in ((22, 4), (24, 2), (25, 2), (26, 2), (28, 3)):
        assert versioned(PRODUCER_FENCED, RequestHeader(api, first - 1, 1, None)) == INVALID_PRODUCER_EPOCH
        assert versioned(PRODUCER_FENCED, RequestHeader(api, first, 1, None)) == PRODUCER_FENCED
    assert versioned(51, RequestHeader(26, 0, 1, None)) == 51  # other codes pass as they are


def test_kip_890_part_2_versions_are_not_advertised() -> None:
    assert TXN_SUPPORTED[24][1] <= 3 and TXN_SUPPORTED[26][1] <= 4  # AddPartitionsToTxn v4+, EndTxn v5
    from gregor.kafka.handlers import SUPPORTED

    assert SUPPORTED[0][1] < 12  # Produce 12+ would tell clients the broker verifies transactions itself
