"""Transactions in the partition's producer state (pure): open transactions, the LSO, markers, snapshots v2,
and the consumer's per-batch read_committed filter."""

from __future__ import annotations

import gregor_native as native

from gregor.broker.producer_state import (
    NO_TXN, ProducerStateManager, decode_snapshot, encode_snapshot, parse_batch_infos,
)
from gregor.broker.replication_state import ReplicationState
from gregor.client.txn_filter import committed_rows
from gregor.common.control_records import ABORT, COMMIT, decode_marker, encode_marker_batch
from gregor.common.records import batch_headers, build_batch


def data(pid: int, value: bytes, seq: int, transactional: bool = True) -> bytes:
    return build_batch([(None, value, [], 0)], producer_id=pid, producer_epoch=0, base_sequence=seq,
                       transactional=transactional)


def with_offsets(batches: list[bytes]) -> bytes:
    """Batches as a log holds them: consecutive base offsets (the leader's job, done by hand here)."""
    out, offset = [], 0
    for b in batches:
        buf = bytearray(b)
        buf[0:8] = offset.to_bytes(8, "big")
        out.append(bytes(buf))
        offset += 1
    return b"".join(out)


def test_markers_round_trip() -> None:
    batch = encode_marker_batch(5, 2, True, 9, 1234)
    h = native.parse_batches(batch)[0]
    assert h.is_control and h.is_transactional and (h.producer_id, h.producer_epoch) == (5, 2)
    assert decode_marker(batch, 0, len(batch), 1) == (COMMIT, 9)
    assert decode_marker(encode_marker_batch(5, 2, False, 9, 0), 0, len(batch), 1).control_type == ABORT
    plain = build_batch([(None, b"x", [], 0)])
    assert decode_marker(plain, 0, len(plain), 1) is None, "a one-byte value is no marker key"


def test_open_transactions_set_the_lso_and_markers_release_it(tmp_path: str) -> None:
    psm = ProducerStateManager("t", 0, str(tmp_path))
    infos = parse_batch_infos(with_offsets([data(1, b"a", 0), data(2, b"b", 0), data(3, b"c", 0, False)]))
    assert infos is not None
    assert psm.update(infos) == []
    assert psm.ongoing_txns == {1: 0, 2: 1}
    leader = ReplicationState(0, high_watermark=3)
    assert leader.last_stable_offset(psm.first_unstable_offset(3)) == 0
    assert leader.last_stable_offset(None) == 3, "no open transaction: the LSO is the HW"
    marker = parse_batch_infos(encode_marker_batch(1, 0, False, 4, 0))
    assert marker is not None
    (done,) = psm.update(marker, first_offset=3)
    assert (done.producer_id, done.first_offset, done.last_offset, done.is_aborted) == (1, 0, 3, True)
    assert done.last_stable_offset == 1, "producer 2's transaction from offset 1 is still undecided"
    assert psm.first_unstable_offset(3) == 0, "the marker is not below the HW yet"
    assert psm.first_unstable_offset(4) == 1
    assert psm.producers[1].coordinator_epoch == 4 and psm.producers[1].current_txn_first_offset == NO_TXN
    # Snapshots (v2) keep the open transaction and the coordinator epoch.
    back = {e.producer_id: e for e in decode_snapshot(encode_snapshot(psm.producers.values()))}
    assert back[2].current_txn_first_offset == 1 and back[1].coordinator_epoch == 4
    assert psm.update(parse_batch_infos(encode_marker_batch(9, 0, True, 4, 0)) or [], first_offset=4) == [], \
        "a marker for a producer without a transaction here completes nothing"


def test_read_committed_filter_drops_aborted_batches_only() -> None:
    # offsets: 0 p1 a1 | 1 p2 b1 | 2 p1 a2 | 3 ABORT p1 | 4 p2 b2 | 5 COMMIT p2 | 6 p1 a3 (new txn) | 7 plain
    raw = with_offsets([data(1, b"a1", 0), data(2, b"b1", 0), data(1, b"a2", 1), encode_marker_batch(1, 0, False, 0, 0),
                        data(2, b"b2", 1), encode_marker_batch(2, 0, True, 0, 0), data(1, b"a3", 2),
                        build_batch([(None, b"plain", [], 0)])])
    headers = batch_headers(raw)
    rows = committed_rows(raw, headers, [(1, 0)])
    assert [r[3] for r in rows] == [b"b1", b"b2", b"a3", b"plain"]
    assert [r[3] for r in committed_rows(raw, headers, [(1, 0)], min_offset=4)] == [b"b2", b"a3", b"plain"]
    assert [r[3] for r in committed_rows(raw, headers, [])] == [b"a1", b"b1", b"a2", b"b2", b"a3", b"plain"]
