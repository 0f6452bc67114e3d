"""The producer gateway role (stateless gRPC front door for thin producers); its API is proto/gregor/rpc/v1/gateway.proto and the service lands with the clients issue."""
