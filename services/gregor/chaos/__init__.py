"""Gregor's chaos workload, its history format and the Jepsen-style checker (docs/chaos.md).

One code path for both pipelines: the network-namespace suite (`make chaos`, tests/e2e/chaos) runs
`gregor chaos workload` / `gregor chaos check`, and so do the kind pipeline's Jobs (deploy/kind/chaos).
"""
