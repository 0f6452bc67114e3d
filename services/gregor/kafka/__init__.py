"""Kafka wire protocol listener: existing Kafka clients (librdkafka, kafka-python, ...) against Gregor's brokers.

codec.py frames and (de)serialises requests with `kio` (generated from Kafka's JSON schemas),
server.py is the per-broker asyncio listener, handlers.py maps each API onto the broker's
internals (ReplicaManager, MetadataCache, controller link) and the group coordinators' gRPC.
"""
