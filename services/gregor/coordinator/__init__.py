"""The group coordinator role (consumer groups, rebalances, committed offsets); its API is proto/gregor/rpc/v1/coordinator.proto and the service lands with the clients issue."""
