"""A cluster-mode broker's calls to the active controller: admin forwarding and producer-id blocks.

The controller moves (failover), so each call looks it up in etcd and retries a
NOT_CONTROLLER or unreachable answer until its deadline.
Concurrency: coroutines on the broker's event loop; no state of their own.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import grpc

from gregor.broker.limits import FORWARD_TIMEOUT_S, FORWARD_RETRY_S
from gregor.common import errors
from gregor.common.etcd import EtcdError
from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc

if TYPE_CHECKING:
    from gregor.broker.broker import Broker



async def allocate_producer_ids(broker: "Broker") -> tuple[int, int]:
    """One AllocateProducerIds round trip to the active controller (found through etcd)."""
    membership = broker.membership
    if membership is None:
        raise errors.error_for(errors.Code.NOT_CONTROLLER, "not registered in a cluster")
    try:
        epoch = await membership.wait_registered()
        _, ch = await membership.controller_channel()
        resp = await controller_pb2_grpc.ControllerServiceStub(ch).AllocateProducerIds(
            controller_pb2.AllocateProducerIdsRequest(broker_id=broker.config.broker_id, broker_epoch=epoch),
            timeout=FORWARD_TIMEOUT_S)
    except grpc.RpcError as exc:
        raise errors.from_rpc_error(exc) from None
    except EtcdError as exc:
        raise errors.error_for(errors.Code.NOT_CONTROLLER, f"cannot read the controller from etcd: {exc}")
    if resp.error.code:
        raise errors.error_for(resp.error.code, resp.error.message)
    return resp.producer_id_start, resp.producer_id_len


async def forward_to_controller(broker: "Broker", api: str, request: Any, remaining: float | None,
                                metadata: Any = None) -> Any:
    """Relay an AdminService call to the active controller; `remaining` is the caller's deadline in seconds."""
    deadline = time.monotonic() + min(remaining if remaining is not None else FORWARD_TIMEOUT_S,
                                      FORWARD_TIMEOUT_S)
    last: errors.GregorError = errors.error_for(errors.Code.NOT_CONTROLLER, "no active controller")
    while time.monotonic() < deadline:
        try:
            membership = broker.membership
            assert membership is not None
            _, ch = await membership.controller_channel()
            stub = controller_pb2_grpc.AdminServiceStub(ch)
            return await getattr(stub, api)(request, timeout=max(0.1, deadline - time.monotonic()),
                                            metadata=metadata)
        except grpc.RpcError as exc:
            last = errors.from_rpc_error(exc)
            if last.code not in (errors.Code.NOT_CONTROLLER, errors.Code.NETWORK_EXCEPTION):
                raise last
        except EtcdError as exc:
            last = errors.error_for(errors.Code.NOT_CONTROLLER, f"cannot read the controller from etcd: {exc}")
        except errors.GregorError as err:
            last = err
        await asyncio.sleep(FORWARD_RETRY_S)
    raise last
