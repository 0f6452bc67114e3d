"""Kafka error codes round-trip through gRPC statuses with a typed detail."""

from __future__ import annotations

import grpc
import pytest

from gregor.common import errors


def test_every_code_has_a_class_with_kafka_name() -> None:
    err = errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "moved", topic="t", partition=2, leader_id=3)
    assert type(err).__name__ == "NotLeaderOrFollowerError"
    assert isinstance(err, errors.GregorError) and err.retriable
    assert err.status_code == grpc.StatusCode.FAILED_PRECONDITION
    assert str(err) == "NOT_LEADER_OR_FOLLOWER [t-2]: moved"
    assert errors.error_for(errors.Code.CORRUPT_MESSAGE).retriable is False


@pytest.mark.parametrize("code", [c for c in errors.ERROR_CLASSES])
def test_status_round_trip(code: int) -> None:
    err = errors.error_for(code, "why", topic="orders", partition=1, leader_id=2, leader_epoch=7)
    status = errors.to_status(err)

    class FakeCall(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return status.code

        def details(self) -> str:
            return status.details

        def trailing_metadata(self):  # type: ignore[no-untyped-def]
            return status.trailing_metadata

    back = errors.from_rpc_error(FakeCall())
    assert (back.code, back.message, back.topic, back.partition, back.leader_id, back.leader_epoch) == (
        code, "why", "orders", 1, 2, 7)
    assert type(back) is type(err)


def test_transport_failure_without_detail_maps_to_network_exception() -> None:
    class Down(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "connection refused"

        def trailing_metadata(self):  # type: ignore[no-untyped-def]
            return ()

    err = errors.from_rpc_error(Down())
    assert err.code == errors.Code.NETWORK_EXCEPTION and "connection refused" in err.message
