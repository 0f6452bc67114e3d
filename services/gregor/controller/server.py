"""gRPC servicers of the controller: proto <-> domain, nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from gregor.common import errors
from gregor.common.rpc import rpc_method
from gregor.rpc.v1 import common_pb2, controller_pb2, controller_pb2_grpc

if TYPE_CHECKING:
    from gregor.controller.controller import Controller

Ctx = grpc.aio.ServicerContext


class ControllerServicer(controller_pb2_grpc.ControllerServiceServicer):
    """ControllerService: broker-facing requests, answered NOT_CONTROLLER by standbys."""

    def __init__(self, controller: "Controller") -> None:
        self.controller = controller

    def _require_active(self) -> None:
        if not self.controller.is_active:
            raise errors.error_for(errors.Code.NOT_CONTROLLER,
                                   f"controller {self.controller.controller_id} is not the active controller "
                                   f"(active: {self.controller.active_controller_id})")

    @rpc_method("ControllerService")
    async def ControlledShutdown(self, request: controller_pb2.ControlledShutdownRequest,
                                 context: Ctx) -> controller_pb2.ControlledShutdownResponse:
        self._require_active()
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "ControlledShutdown is not implemented yet")
        raise AssertionError("unreachable")

    @rpc_method("ControllerService")
    async def AllocateProducerIds(self, request: controller_pb2.AllocateProducerIdsRequest,
                                  context: Ctx) -> controller_pb2.AllocateProducerIdsResponse:
        self._require_active()
        start, length = await self.controller.allocate_producer_ids(request.broker_id, request.broker_epoch)
        return controller_pb2.AllocateProducerIdsResponse(producer_id_start=start, producer_id_len=length)


class ControllerAdminServicer(controller_pb2_grpc.AdminServiceServicer):
    """AdminService on a controller; so far only DescribeCluster, read straight from etcd."""

    def __init__(self, controller: "Controller") -> None:
        self.controller = controller

    @rpc_method("AdminService")
    async def DescribeCluster(self, request: controller_pb2.DescribeClusterRequest,
                              context: Ctx) -> controller_pb2.DescribeClusterResponse:
        desc = await self.controller.describe_cluster()
        brokers = [
            common_pb2.BrokerEndpoint(
                broker_id=b.broker_id, broker_epoch=b.broker_epoch, host=str(b.info.get("host", "")),
                grpc_port=int(b.info.get("grpc_port", 0) or 0),  # type: ignore[call-overload]
                data_port=int(b.info.get("data_port", 0) or 0),  # type: ignore[call-overload]
                rack=str(b.info.get("rack", "") or ""))
            for b in desc.brokers
        ]
        return controller_pb2.DescribeClusterResponse(
            cluster_id=self.controller.etcd.cluster, controller_id=desc.controller_id,
            controller_epoch=desc.controller_epoch, brokers=brokers)
