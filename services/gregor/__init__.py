"""Gregor: Kafka's replicated, partitioned commit log as gRPC microservices."""

__version__ = "0.1.0"
