"""Kafka error codes as Python exceptions, and their mapping to gRPC statuses.

Servers raise a GregorError and `abort_with` turns it into a gRPC status whose
grpc-status-details-bin trailer carries an ErrorDetail; clients turn any
RpcError back into the same exception with `from_rpc_error`, so both sides
speak Kafka's error vocabulary.
"""

from __future__ import annotations

from typing import cast

import grpc
from google.rpc import status_pb2
from grpc_status import rpc_status

from gregor.rpc.v1 import common_pb2

Code = common_pb2.ErrorCode
S = grpc.StatusCode

# code -> (gRPC status, retriable). FAILED_PRECONDITION where the client must
# change something first (refresh metadata, new epoch); UNAVAILABLE where the
# same request may simply be retried later.
_TABLE: dict[int, tuple[grpc.StatusCode, bool]] = {
    Code.UNKNOWN_SERVER_ERROR: (S.INTERNAL, False),
    Code.OFFSET_OUT_OF_RANGE: (S.OUT_OF_RANGE, False),
    Code.CORRUPT_MESSAGE: (S.INVALID_ARGUMENT, False),
    Code.UNKNOWN_TOPIC_OR_PARTITION: (S.NOT_FOUND, True),
    Code.INVALID_FETCH_SIZE: (S.INVALID_ARGUMENT, False),
    Code.LEADER_NOT_AVAILABLE: (S.UNAVAILABLE, True),
    Code.NOT_LEADER_OR_FOLLOWER: (S.FAILED_PRECONDITION, True),
    Code.REQUEST_TIMED_OUT: (S.DEADLINE_EXCEEDED, True),
    Code.BROKER_NOT_AVAILABLE: (S.UNAVAILABLE, True),
    Code.REPLICA_NOT_AVAILABLE: (S.UNAVAILABLE, True),
    Code.MESSAGE_TOO_LARGE: (S.INVALID_ARGUMENT, False),
    Code.STALE_CONTROLLER_EPOCH: (S.FAILED_PRECONDITION, False),
    Code.NETWORK_EXCEPTION: (S.UNAVAILABLE, True),
    Code.COORDINATOR_LOAD_IN_PROGRESS: (S.UNAVAILABLE, True),
    Code.COORDINATOR_NOT_AVAILABLE: (S.UNAVAILABLE, True),
    Code.NOT_COORDINATOR: (S.FAILED_PRECONDITION, True),
    Code.INVALID_TOPIC_EXCEPTION: (S.INVALID_ARGUMENT, False),
    Code.RECORD_LIST_TOO_LARGE: (S.INVALID_ARGUMENT, False),
    Code.NOT_ENOUGH_REPLICAS: (S.UNAVAILABLE, True),
    Code.NOT_ENOUGH_REPLICAS_AFTER_APPEND: (S.UNAVAILABLE, True),
    Code.INVALID_REQUIRED_ACKS: (S.INVALID_ARGUMENT, False),
    Code.ILLEGAL_GENERATION: (S.FAILED_PRECONDITION, False),
    Code.INCONSISTENT_GROUP_PROTOCOL: (S.INVALID_ARGUMENT, False),
    Code.INVALID_GROUP_ID: (S.INVALID_ARGUMENT, False),
    Code.UNKNOWN_MEMBER_ID: (S.FAILED_PRECONDITION, False),
    Code.INVALID_SESSION_TIMEOUT: (S.INVALID_ARGUMENT, False),
    Code.REBALANCE_IN_PROGRESS: (S.ABORTED, False),
    Code.INVALID_COMMIT_OFFSET_SIZE: (S.INVALID_ARGUMENT, False),
    Code.INVALID_TIMESTAMP: (S.INVALID_ARGUMENT, False),
    Code.TOPIC_AUTHORIZATION_FAILED: (S.PERMISSION_DENIED, False),
    Code.GROUP_AUTHORIZATION_FAILED: (S.PERMISSION_DENIED, False),
    Code.CLUSTER_AUTHORIZATION_FAILED: (S.PERMISSION_DENIED, False),
    Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: (S.PERMISSION_DENIED, False),
    Code.TOPIC_ALREADY_EXISTS: (S.ALREADY_EXISTS, False),
    Code.INVALID_PARTITIONS: (S.INVALID_ARGUMENT, False),
    Code.INVALID_REPLICATION_FACTOR: (S.INVALID_ARGUMENT, False),
    Code.INVALID_REPLICA_ASSIGNMENT: (S.INVALID_ARGUMENT, False),
    Code.INVALID_CONFIG: (S.INVALID_ARGUMENT, False),
    Code.NOT_CONTROLLER: (S.UNAVAILABLE, True),
    Code.INVALID_REQUEST: (S.INVALID_ARGUMENT, False),
    Code.POLICY_VIOLATION: (S.FAILED_PRECONDITION, False),
    Code.OUT_OF_ORDER_SEQUENCE_NUMBER: (S.FAILED_PRECONDITION, False),
    Code.DUPLICATE_SEQUENCE_NUMBER: (S.ALREADY_EXISTS, False),
    Code.INVALID_PRODUCER_EPOCH: (S.FAILED_PRECONDITION, False),
    Code.INVALID_TXN_STATE: (S.FAILED_PRECONDITION, False),
    Code.INVALID_PRODUCER_ID_MAPPING: (S.FAILED_PRECONDITION, False),
    Code.CONCURRENT_TRANSACTIONS: (S.UNAVAILABLE, True),
    Code.KAFKA_STORAGE_ERROR: (S.UNAVAILABLE, True),
    Code.UNKNOWN_PRODUCER_ID: (S.FAILED_PRECONDITION, False),
    Code.NON_EMPTY_GROUP: (S.FAILED_PRECONDITION, False),
    Code.GROUP_SUBSCRIBED_TO_TOPIC: (S.FAILED_PRECONDITION, False),
    Code.GROUP_ID_NOT_FOUND: (S.NOT_FOUND, False),
    Code.FETCH_SESSION_ID_NOT_FOUND: (S.FAILED_PRECONDITION, True),
    Code.INVALID_FETCH_SESSION_EPOCH: (S.FAILED_PRECONDITION, True),
    Code.TOPIC_DELETION_DISABLED: (S.FAILED_PRECONDITION, False),
    Code.FENCED_LEADER_EPOCH: (S.FAILED_PRECONDITION, True),
    Code.UNKNOWN_LEADER_EPOCH: (S.UNAVAILABLE, True),
    Code.UNSUPPORTED_COMPRESSION_TYPE: (S.INVALID_ARGUMENT, False),
    Code.STALE_BROKER_EPOCH: (S.FAILED_PRECONDITION, False),
    Code.OFFSET_NOT_AVAILABLE: (S.UNAVAILABLE, True),
    Code.MEMBER_ID_REQUIRED: (S.FAILED_PRECONDITION, False),
    Code.PREFERRED_LEADER_NOT_AVAILABLE: (S.UNAVAILABLE, True),
    Code.GROUP_MAX_SIZE_REACHED: (S.RESOURCE_EXHAUSTED, False),
    Code.FENCED_INSTANCE_ID: (S.FAILED_PRECONDITION, False),
    Code.ELIGIBLE_LEADERS_NOT_AVAILABLE: (S.UNAVAILABLE, True),
    Code.ELECTION_NOT_NEEDED: (S.FAILED_PRECONDITION, False),
    Code.INVALID_RECORD: (S.INVALID_ARGUMENT, False),
    Code.THROTTLING_QUOTA_EXCEEDED: (S.RESOURCE_EXHAUSTED, True),
    Code.INVALID_TRANSACTION_TIMEOUT: (S.INVALID_ARGUMENT, False),
    Code.TRANSACTION_COORDINATOR_FENCED: (S.FAILED_PRECONDITION, False),
    Code.PRODUCER_FENCED: (S.FAILED_PRECONDITION, False),
    Code.TRANSACTIONAL_ID_NOT_FOUND: (S.NOT_FOUND, False),
    # KIP-516: retriable in Kafka (InvalidMetadataException) after a metadata refresh.
    Code.UNKNOWN_TOPIC_ID: (S.FAILED_PRECONDITION, True),
    Code.INCONSISTENT_TOPIC_ID: (S.FAILED_PRECONDITION, True),
}

# What a transport-level failure (no ErrorDetail) means in Kafka's terms.
_STATUS_FALLBACK: dict[grpc.StatusCode, int] = {
    S.UNAVAILABLE: Code.NETWORK_EXCEPTION,
    S.DEADLINE_EXCEEDED: Code.REQUEST_TIMED_OUT,
    S.CANCELLED: Code.NETWORK_EXCEPTION,
    S.RESOURCE_EXHAUSTED: Code.RECORD_LIST_TOO_LARGE,
    S.INVALID_ARGUMENT: Code.INVALID_REQUEST,
    S.UNIMPLEMENTED: Code.INVALID_REQUEST,
}


def code_name(code: int) -> str:
    """Kafka's name of an error code, e.g. 'NOT_LEADER_OR_FOLLOWER'."""
    try:
        return Code.Name(code)
    except ValueError:
        return f"UNKNOWN_ERROR_{code}"


class GregorError(Exception):
    """An error with a Kafka error code; subclasses exist for every code."""

    code: int = Code.UNKNOWN_SERVER_ERROR

    def __init__(
        self,
        message: str = "",
        *,
        topic: str = "",
        partition: int = -1,
        leader_id: int = -1,
        leader_epoch: int = -1,
    ) -> None:
        super().__init__(message or code_name(self.code))
        self.message = message or code_name(self.code)
        self.topic = topic
        self.partition = partition
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch

    @property
    def name(self) -> str:
        return code_name(self.code)

    @property
    def retriable(self) -> bool:
        return _TABLE.get(self.code, (S.INTERNAL, False))[1]

    @property
    def status_code(self) -> grpc.StatusCode:
        return _TABLE.get(self.code, (S.INTERNAL, False))[0]

    def to_detail(self) -> common_pb2.ErrorDetail:
        return common_pb2.ErrorDetail(
            code=cast("common_pb2.ErrorCode", self.code),  # an int: protobuf takes enum fields as ints
            message=self.message,
            retriable=self.retriable,
            topic=self.topic,
            partition=self.partition,
            leader_id=self.leader_id,
            leader_epoch=self.leader_epoch,
        )

    def __str__(self) -> str:
        where = f" [{self.topic}-{self.partition}]" if self.topic else ""
        return f"{self.name}{where}: {self.message}"


def _class_name(code_name_: str) -> str:
    return "".join(part.capitalize() for part in code_name_.split("_")) + "Error"


# One subclass per code: NotLeaderOrFollowerError, OffsetOutOfRangeError, ...
ERROR_CLASSES: dict[int, type[GregorError]] = {Code.UNKNOWN_SERVER_ERROR: GregorError}
for _code in _TABLE:
    if _code == Code.UNKNOWN_SERVER_ERROR:
        continue
    _cls = type(_class_name(code_name(_code)), (GregorError,), {"code": _code, "__module__": __name__})
    ERROR_CLASSES[_code] = _cls
    globals()[_cls.__name__] = _cls

UnknownServerError = GregorError


def error_for(code: int, message: str = "", **where: object) -> GregorError:
    """The exception instance for a Kafka error code."""
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        err = GregorError(message or code_name(code), **where)  # type: ignore[arg-type]
        err.code = code
        return err
    return cls(message, **where)  # type: ignore[arg-type]


def from_detail(detail: common_pb2.ErrorDetail) -> GregorError:
    return error_for(
        detail.code,
        detail.message,
        topic=detail.topic,
        partition=detail.partition,
        leader_id=detail.leader_id,
        leader_epoch=detail.leader_epoch,
    )


def to_status(err: GregorError) -> grpc.Status:
    """A grpc.Status whose details trailer holds the ErrorDetail."""
    status = status_pb2.Status(code=err.status_code.value[0], message=str(err))
    status.details.add().Pack(err.to_detail())
    return rpc_status.to_status(status)


async def abort_with(context: grpc.aio.ServicerContext, err: GregorError) -> None:
    """Abort the current RPC with err as status + typed detail (never returns)."""
    await context.abort_with_status(to_status(err))


def from_rpc_error(exc: grpc.RpcError) -> GregorError:
    """Turn a failed RPC into the GregorError it carried (or a transport one)."""
    status = rpc_status.from_call(exc) if hasattr(exc, "trailing_metadata") else None
    if status is not None:
        for any_ in status.details:
            if any_.Is(common_pb2.ErrorDetail.DESCRIPTOR):
                detail = common_pb2.ErrorDetail()
                any_.Unpack(detail)
                return from_detail(detail)
    code = exc.code() if hasattr(exc, "code") else S.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return error_for(_STATUS_FALLBACK.get(code, Code.UNKNOWN_SERVER_ERROR), f"{code.name}: {details}")
