"""The broker role: partition replicas, produce and fetch, purgatories, zero-copy data port."""
