"""Every fixed limit of the broker (timeouts, backoffs, retries, sizes) with its default and why.

Configurable limits (server.properties) live in gregor.common.config.BrokerConfig; these are
the fixed ones. Kafka's config name is given where the value mirrors one.
"""

from __future__ import annotations

# -- Replica fetchers (seeds 002, 004): replica_fetcher.py
REPLICA_FETCH_MAX_BYTES = 1_048_576  # replica.fetch.max.bytes
REPLICA_FETCH_WAIT_MAX_MS = 500  # replica.fetch.wait.max.ms: the leader holds an empty fetch this long
REPLICA_FETCH_MIN_BYTES = 1  # replica.fetch.min.bytes: answer as soon as any partition has a byte
REPLICA_FETCH_BACKOFF_S = 0.2  # replica.fetch.backoff.ms: pause after an error or a fenced epoch
# A partition added while a fetch is out cuts the poll short (a new stream, so its session starts over with a
# full request) only while the session has at most this many partitions: re-listing a large session costs the
# leader a read per partition, and a creation adding 100 partitions per LeaderAndIsr chunk to sessions of
# thousands re-listed them all per chunk (issue 24). Larger sessions name the new partitions in the next
# incremental request, once the poll is answered (within replica.fetch.wait.max.ms), as Kafka's fetcher does.
REPLICA_FETCH_INTERRUPT_MAX_PARTITIONS = 100
# A follower's fetch session names every partition again at least this many times per
# replica.lag.time.max.ms, so the leader records a recent fetch of each idle one (KIP-227 sessions).
REPLICA_FETCH_SESSION_REFRESH_PARTS = 3
FETCH_RPC_TIMEOUT_S = 10.0  # one Fetch / OffsetForLeaderEpoch round trip
MAX_TRUNCATION_ROUNDS = 8  # OffsetForLeaderEpoch rounds before giving up on converging (KIP-279)

# -- ISR writes (seed 000): isr_manager.py
ISR_WRITE_ATTEMPTS = 3  # CAS retries while the leader epoch is unchanged (someone else wrote the ISR)

# -- High-watermark checkpoint: replica_manager.py
HW_CHECKPOINT_INTERVAL_MS = 5000  # replica.high.watermark.checkpoint.interval.ms

# -- Calls to the active controller: controller_link.py
FORWARD_TIMEOUT_S = 30.0  # how long a forwarded admin call may take, retries for a moving controller included
FORWARD_RETRY_S = 0.2  # pause before asking etcd again who the controller is

# -- Zero-copy data port: data_port.py
REQUEST_FRAME_MAX_BYTES = 1 << 20  # a FetchRequest is a few dozen bytes; anything huge is garbage
# A follower's full ReplicaFetchRequest names every partition it copies from the leader (~60 bytes each): the
# gRPC stream's message cap (socket.request.max.bytes' default).
REPLICA_REQUEST_FRAME_MAX_BYTES = 104_857_600
REPLICA_FRAME = 0x8000_0000  # the high bit of a data-port request frame's length: a follower's ReplicaFetchRequest

# -- Broker registration and controlled shutdown: cluster_membership.py
REGISTER_RETRY_S = 0.2  # pause between attempts while an old registration or etcd is in the way
REGISTER_WAIT_S = 10.0  # a control request waits this long for our own registration to finish
CONTROLLED_SHUTDOWN_RPC_TIMEOUT_S = 30.0  # one ControlledShutdown attempt (Kafka: request.timeout.ms)

# -- FindCoordinator lookup in etcd: coordinator_lookup.py
LOOKUP_SYNC_WAIT_S = 2.0  # a request arriving before the first etcd read waits at most this long for it
LOOKUP_RETRY_S = 0.5  # pause before reading etcd again after an error

# -- Producer-id blocks: producer_id_manager.py
PRODUCER_ID_PREFETCH_THRESHOLD = 0.9  # ask for the next block once this share of the current one is used
PRODUCER_ID_BLOCK_WAIT_S = 10.0  # InitProducerId waits this long for a block before answering a retriable error
PRODUCER_ID_BLOCK_RETRY_S = 0.2  # pause between failed block requests

# -- Control requests from the controller: replica_manager.py
# LeaderAndIsr / StopReplica are applied this many partitions at a time: the chunk's new logs are laid out
# (in slices of OPEN_LOGS_SLICE_S, log_manager.py), then the loop serves what waits before the next chunk (issue 24: a 10,000-partition
# creation held a broker's loop for minutes and cost it its etcd session).
LEADER_AND_ISR_CHUNK = 100
# How long a LeaderAndIsr/StopReplica apply waits in the event loop between chunks. Not asyncio.sleep(0): that
# is one loop iteration, and a gRPC call needs several (each step's completion comes back through grpc's poller
# thread, which needs the GIL the apply holds), so a broker answered one queued call per 50-70 ms chunk and
# nothing sent during a 1,000-partition apply was answered in it (test_leader_and_isr_apply: 0-3 of ~2,000
# calls in 0.45 s). A 1 ms wait in select lets each waiting call take a step per chunk: 24-63 calls sent and
# answered inside 3-11 s applies on a loaded machine. Waiting at every 20 ms slice of open_logs as well let 84-174
# through in 1.7-3.8 s, but made a 5,000-partition creation ~15 % slower (bench_leader_and_isr, same run):
# slices keep sleep(0).
CONTROL_YIELD_S = 0.001
