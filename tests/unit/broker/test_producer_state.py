"""ProducerStateManager's pure rules (seed 003's idempotence): duplicates, gaps, epochs, snapshots, rebuild."""

from __future__ import annotations

import os

import gregor_native as native
import pytest

from gregor.broker.producer_state import (
    INT32_MAX,
    BatchInfo,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    increment_sequence,
    parse_batch_infos,
)
from gregor.common import errors
from gregor.common.records import build_batch

PID = 7


def batch(seq: int, n: int = 1, epoch: int = 0, pid: int = PID, base_offset: int = 0, ts: int = 1000) -> BatchInfo:
    return BatchInfo(0, 100, base_offset, n - 1, ts, pid, epoch, seq)


def appended(psm: ProducerStateManager, *batches: BatchInfo) -> None:
    """Check as the leader does, then apply at the state's end offset."""
    assert psm.check_leader_append(list(batches)) is None
    psm.update(list(batches), psm.map_end_offset)


def code_of(excinfo: pytest.ExceptionInfo[errors.GregorError]) -> str:
    return errors.code_name(excinfo.value.code)


@pytest.fixture
def psm(tmp_path: os.PathLike[str]) -> ProducerStateManager:
    return ProducerStateManager("t", 0, str(tmp_path))


def test_next_sequence_is_accepted_and_offsets_tracked(psm: ProducerStateManager) -> None:
    appended(psm, batch(0, 3))
    appended(psm, batch(3, 2))
    entry = psm.producers[PID]
    assert entry.last_seq == 4 and entry.last_offset == 4 and psm.map_end_offset == 5
    assert [(b.first_seq, b.last_seq, b.first_offset) for b in entry.batches] == [(0, 2, 0), (3, 4, 3)]


def test_duplicate_of_any_of_the_last_five_returns_its_original_offsets(psm: ProducerStateManager) -> None:
    for i in range(6):
        psm.update([batch(i * 2, 2)], psm.map_end_offset + 10)  # other producers' records in between
    # The oldest (seq 0..1) fell out of the 5 retained batches; 2..3 .. 10..11 remain.
    dup = psm.check_leader_append([batch(4, 2)])
    assert dup is not None and (dup.first_offset, dup.last_offset) == (34, 35)
    with pytest.raises(errors.GregorError) as exc:
        psm.check_leader_append([batch(0, 2)])
    assert code_of(exc) == "OUT_OF_ORDER_SEQUENCE_NUMBER"


def test_gap_is_out_of_order_and_changes_nothing(psm: ProducerStateManager) -> None:
    appended(psm, batch(0, 5))
    with pytest.raises(errors.GregorError) as exc:
        psm.check_leader_append([batch(10)])
    assert code_of(exc) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert psm.producers[PID].last_seq == 4
    appended(psm, batch(5))


def test_same_range_with_other_size_is_not_a_duplicate(psm: ProducerStateManager) -> None:
    appended(psm, batch(0, 3))
    with pytest.raises(errors.GregorError) as exc:
        psm.check_leader_append([batch(0, 2)])
    assert code_of(exc) == "OUT_OF_ORDER_SEQUENCE_NUMBER"


def test_stale_epoch_is_invalid_producer_epoch(psm: ProducerStateManager) -> None:
    appended(psm, batch(0, epoch=3))
    with pytest.raises(errors.GregorError) as exc:
        psm.check_leader_append([batch(1, epoch=2)])
    assert code_of(exc) == "INVALID_PRODUCER_EPOCH"


def test_new_epoch_must_start_at_zero_and_forgets_old_batches(psm: ProducerStateManager) -> None:
    appended(psm, batch(0, 4, epoch=0))
    with pytest.raises(errors.GregorError) as exc:
        psm.check_leader_append([batch(4, epoch=1)])
    assert code_of(exc) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    appended(psm, batch(0, epoch=1))
    entry = psm.producers[PID]
    assert entry.producer_epoch == 1 and len(entry.batches) == 1
    # The old epoch's batch is no duplicate any more, and its epoch is stale now.
    with pytest.raises(errors.GregorError) as exc:
        psm.check_leader_append([batch(0, 4, epoch=0)])
    assert code_of(exc) == "INVALID_PRODUCER_EPOCH"


def test_unknown_producer_must_start_at_zero(psm: ProducerStateManager) -> None:
    with pytest.raises(errors.GregorError) as exc:
        psm.check_leader_append([batch(3)])
    assert code_of(exc) == "UNKNOWN_PRODUCER_ID"
    appended(psm, batch(0))


def test_batches_of_one_request_chain_their_sequences(psm: ProducerStateManager) -> None:
    appended(psm, batch(0, 2), batch(2, 3), batch(0, pid=99))
    assert psm.producers[PID].last_seq == 4 and psm.producers[99].last_offset == 5
    with pytest.raises(errors.GregorError) as exc:
        psm.check_leader_append([batch(5), batch(7)])
    assert code_of(exc) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    # A duplicate inside a multi-batch request is refused whole.
    with pytest.raises(errors.GregorError) as exc:
        psm.check_leader_append([batch(2, 3), batch(5)])
    assert code_of(exc) == "INVALID_REQUEST"


def test_non_idempotent_batches_are_ignored(psm: ProducerStateManager) -> None:
    appended(psm, batch(-1, 4, pid=-1, epoch=-1))
    assert psm.producers == {} and psm.map_end_offset == 4


def test_sequence_wraps_at_int32_max(psm: ProducerStateManager) -> None:
    assert increment_sequence(INT32_MAX - 1, 3) == 1
    appended(psm, batch(0))
    psm.producers[PID].batches[-1] = psm.producers[PID].batches[-1].__class__(INT32_MAX, 0, 0, 1000)
    appended(psm, batch(0, 2))
    assert psm.producers[PID].last_seq == 1


def test_follower_update_keeps_header_offsets(psm: ProducerStateManager) -> None:
    psm.update([batch(0, 2, base_offset=10), batch(2, 1, base_offset=12)])
    assert psm.producers[PID].last_offset == 12 and psm.map_end_offset == 13


def test_expiration_drops_idle_producers(psm: ProducerStateManager) -> None:
    psm.producer_id_expiration_ms = 1000
    appended(psm, batch(0, ts=5000))
    appended(psm, batch(0, pid=8, ts=9000))
    assert psm.remove_expired_producers(now_ms=9500) == [PID]
    assert list(psm.producers) == [8]


def test_snapshot_round_trip_and_crc(psm: ProducerStateManager, tmp_path: os.PathLike[str]) -> None:
    for i in range(7):
        appended(psm, batch(i * 3, 3, ts=1000 + i))
    appended(psm, batch(0, epoch=2, pid=11))
    data = encode_snapshot(psm.producers.values())
    entries = {e.producer_id: e for e in decode_snapshot(data)}
    assert list(entries[PID].batches) == list(psm.producers[PID].batches)
    assert entries[11].producer_epoch == 2 and entries[PID].last_timestamp == 1006
    corrupt = bytearray(data)
    corrupt[-1] ^= 1
    with pytest.raises(ValueError):
        decode_snapshot(bytes(corrupt))
    with pytest.raises(ValueError):
        decode_snapshot(data[:-3])
    path = psm.take_snapshot()
    assert os.path.basename(path) == f"{psm.map_end_offset:020d}.snapshot"


def test_parse_batch_infos_reads_producer_fields() -> None:
    a = build_batch([(None, b"x", [], 1), (None, b"y", [], 2)], producer_id=5, producer_epoch=1, base_sequence=9)
    b = build_batch([(None, b"z", [], 3)])
    infos = parse_batch_infos(a + b)
    assert infos is not None
    assert [(i.producer_id, i.producer_epoch, i.base_sequence, i.last_sequence, i.position) for i in infos] == [
        (5, 1, 9, 10, 0), (-1, -1, -1, -1, len(a))]
    assert parse_batch_infos((a + b)[:-1]) is None
    assert parse_batch_infos(b"\x00" * 10) is None


def idem_batch(seq: int, n: int, pid: int = PID, epoch: int = 0) -> bytes:
    return build_batch([(None, f"v{seq + i}".encode(), [], 1000) for i in range(n)],
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_load_rebuilds_from_snapshot_and_log_then_drops_snapshots_past_truncation(tmp_path: os.PathLike[str]) -> None:
    d = os.path.join(str(tmp_path), "t-0")
    lg = native.Log(d, native.LogConfig(segment_bytes=300))
    psm = ProducerStateManager("t", 0, d)
    psm.load(lg)
    for i in range(10):
        info = lg.append_as_leader(idem_batch(i * 2, 2), 0)
        psm.update(parse_batch_infos(idem_batch(i * 2, 2)) or [], info.first_offset)
        if i == 4:
            psm.take_snapshot()  # at offset 10
    assert psm.map_end_offset == lg.log_end_offset == 20
    # Restart: snapshot at 10, header scan 10..20.
    again = ProducerStateManager("t", 0, d)
    assert again.load(lg) == 10
    assert list(again.producers[PID].batches) == list(psm.producers[PID].batches)
    # Truncation below the snapshot: the snapshot goes, the state is rebuilt from the log start.
    psm.take_snapshot()  # at 20
    lg.truncate_to(6)
    assert again.load(lg) == 0
    assert again.snapshot_offsets() == [] and again.producers[PID].last_seq == 5
    assert again.check_leader_append(parse_batch_infos(idem_batch(6, 2)) or []) is None
    dup = again.check_leader_append(parse_batch_infos(idem_batch(4, 2)) or [])
    assert dup is not None and dup.first_offset == 4
    lg.close()
