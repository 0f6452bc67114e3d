"""The producer gateway (`python -m gregor.gateway`): a stateless gRPC front door for thin producers in any language.

API: proto/gregor/rpc/v1/gateway.proto. `gateway.py` holds the domain (the SDK
producer behind buffer.memory admission), `server.py` the servicer, `client.py`
a thin Python client with failover. Docs: docs/gateway.md.
"""
