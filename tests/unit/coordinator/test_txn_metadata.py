"""Kafka's TransactionMetadata rules (coordinator/txn_metadata.py): pure transitions and their typed errors."""

from __future__ import annotations

import pytest

from gregor.common import errors
from gregor.coordinator import txn_metadata as tm
from gregor.coordinator.txn_metadata import TxnState as S

Code = errors.Code


def fresh(pid: int = 7) -> tm.TxnMetadata:
    return tm.init_producer_id(None, "t", 60000, 1000, lambda: pid)


def test_first_init_takes_a_new_producer_id_and_later_ones_bump_the_epoch() -> None:
    md = fresh()
    assert (md.producer_id, md.producer_epoch, md.state) == (7, 0, S.EMPTY)
    again = tm.init_producer_id(md, "t", 30000, 2000, lambda: 99)
    assert (again.producer_id, again.producer_epoch, again.timeout_ms) == (7, 1, 30000)
    worn = tm.TxnMetadata("t", 7, tm.MAX_PRODUCER_EPOCH - 1, 60000)
    renewed = tm.init_producer_id(worn, "t", 60000, 3000, lambda: 99)
    assert (renewed.producer_id, renewed.producer_epoch) == (99, 0), "an exhausted epoch takes a new producer id"


def test_commit_cycle_and_idempotent_retries() -> None:
    md = tm.add_partitions(fresh(), 7, 0, {("a", 0)}, 1000)
    assert md is not None and md.state is S.ONGOING and md.txn_start_ms == 1000
    assert tm.add_partitions(md, 7, 0, {("a", 0)}, 1100) is None, "nothing new: nothing to write"
    md = tm.add_partitions(md, 7, 0, {("b", 1)}, 1200)
    assert md is not None and md.partitions == {("a", 0), ("b", 1)}
    prepared = tm.end_txn(md, 7, 0, True, 1300)
    assert prepared is not None and prepared.state is S.PREPARE_COMMIT
    with pytest.raises(errors.GregorError) as busy:
        tm.add_partitions(prepared, 7, 0, {("c", 0)}, 1400)
    assert busy.value.code == Code.CONCURRENT_TRANSACTIONS
    assert tm.end_txn(prepared, 7, 0, True, 1400) is None, "a retried commit is answered, not re-decided"
    done = tm.complete(prepared, 1500)
    assert (done.state, done.partitions) == (S.COMPLETE_COMMIT, frozenset())
    with pytest.raises(errors.GregorError) as wrong:
        tm.end_txn(done, 7, 0, False, 1600)  # aborting a committed transaction
    assert wrong.value.code == Code.INVALID_TXN_STATE


def test_end_without_a_transaction_and_fencing_are_typed() -> None:
    md = fresh()
    with pytest.raises(errors.GregorError) as e:
        tm.end_txn(md, 7, 0, True, 1000)
    assert e.value.code == Code.INVALID_TXN_STATE
    with pytest.raises(errors.GregorError) as e:
        tm.add_partitions(md, 7, 1, {("a", 0)}, 1000)  # an epoch that is not the current one
    assert e.value.code == Code.PRODUCER_FENCED
    with pytest.raises(errors.GregorError) as e:
        tm.add_partitions(md, 8, 0, {("a", 0)}, 1000)
    assert e.value.code == Code.PRODUCER_FENCED


def test_fence_and_abort_bumps_the_epoch_through_prepare_epoch_fence() -> None:
    md = tm.add_partitions(fresh(), 7, 0, {("a", 0)}, 1000)
    assert md is not None and md.is_expired(62000) and not md.is_expired(60000)
    aborted = tm.fence_and_abort(md, 62000)
    assert (aborted.state, aborted.producer_epoch, aborted.partitions) == (S.PREPARE_ABORT, 1, {("a", 0)})
    with pytest.raises(errors.GregorError) as e:
        tm.end_txn(aborted, 7, 0, True, 62001)  # the old instance's commit
    assert e.value.code == Code.PRODUCER_FENCED
    with pytest.raises(errors.GregorError) as e:
        tm.fence_and_abort(tm.complete(aborted, 62002), 62003)  # only an ongoing transaction is fenced
    assert e.value.code == Code.INVALID_TXN_STATE


def test_offsets_need_add_offsets_and_travel_with_the_state() -> None:
    md = tm.add_partitions(fresh(), 7, 0, {("a", 0)}, 1000)
    assert md is not None
    with pytest.raises(errors.GregorError) as e:
        tm.txn_offset_commit(md, 7, 0, "g", {("in", 0): (5, "")}, 1100)
    assert e.value.code == Code.INVALID_TXN_STATE
    md = md.to(S.ONGOING, 1100, groups=md.groups | {"g"})
    md = tm.txn_offset_commit(md, 7, 0, "g", {("in", 0): (5, "m")}, 1200)
    back = tm.decode_value("t", tm.encode_value(md))
    assert back == md
    assert tm.decode_key(tm.encode_key("t-ü")) == "t-ü"
    with pytest.raises(ValueError):
        tm.decode_key(b"\x00\x01\x00\x05ab")
