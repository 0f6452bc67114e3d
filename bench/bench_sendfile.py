"""Sender CPU of serving log data over loopback TCP two ways:

  sendfile  FileSlice.send_to(fd): sendfile(2) from the segment file, no copy
            through user space
  copy      FileSlice.read() + socket.sendall(): pread into a bytes object, then
            write it to the socket (the baseline)

The reader is a separate process, so only the sender's CPU is counted: the
sender measures its own thread with CLOCK_THREAD_CPUTIME_ID (user + system,
kernel time of sendfile included). Fetches are read_slice(offset, --fetch-kib)
as a broker's fetch path does them. The log is read once before timing so both
ways serve from the page cache. Prints CPU seconds per GiB and the ratio
sendfile/copy, and writes bench/results/sendfile.json.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gregor_native as native  # noqa: E402

from common import (  # noqa: E402
    GIB, MIB, RESULTS_DIR, mb_per_s, measure, median, print_ratio, print_row, thread_rusage_s, write_results,
)

RECORD_BYTES = 1024
BATCH_RECORDS = 16  # a producer's default 16 KiB batch

READER = textwrap.dedent("""
    import socket, sys
    sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    buf = bytearray(1 << 20)
    total = 0
    while True:
        n = sock.recv_into(buf)
        if not n:
            break
        total += n
    print(total, flush=True)
""")


def build_log(path: Path, total_bytes: int) -> tuple[native.Log, int]:
    """A log of ~total_bytes in 16 KiB batches; returns it and its byte size."""
    import os

    values = [os.urandom(RECORD_BYTES) for _ in range(BATCH_RECORDS)]
    batch = native.build_batch(native.encode_records([(None, v, [], 0) for v in values]), BATCH_RECORDS)
    log = native.Log(str(path), native.LogConfig())
    for _ in range(max(1, total_bytes // len(batch))):
        log.append_as_leader(batch, 0)
    log.flush()
    return log, log.size_bytes


def fetch_offsets(log: native.Log, fetch_bytes: int) -> list[int]:
    """The start offset of every fetch; reading the log here also warms the page cache."""
    offsets, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        offsets.append(offset)
        data = log.read(offset, fetch_bytes)
        offset = native.parse_batches(data, verify_crc=False)[-1].next_offset
    return offsets


def serve(log: native.Log, offsets: list[int], fetch_bytes: int, method: str) -> dict:
    """One timed transfer of the whole log to a reader process."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        reader = subprocess.Popen([sys.executable, "-c", READER, str(server.getsockname()[1])],
                                  stdout=subprocess.PIPE, text=True)
        conn, _ = server.accept()
    sent = 0
    fd = conn.fileno()
    user0, sys0 = thread_rusage_s()
    with measure(thread_only=True) as m:
        for offset in offsets:
            piece = log.read_slice(offset, fetch_bytes)
            if method == "sendfile":
                sent += piece.send_to(fd)
            else:
                data = piece.read()
                conn.sendall(data)
                sent += len(data)
        conn.shutdown(socket.SHUT_WR)
    user1, sys1 = thread_rusage_s()
    conn.close()
    out, _ = reader.communicate(timeout=600)
    received = int(out.strip())
    if received != sent:
        raise RuntimeError(f"{method}: reader got {received} bytes, sender sent {sent}")
    gib = sent / GIB
    return {"method": method, "bytes": sent, "wall_s": m.wall_s, "cpu_s": m.cpu_s,
            "user_s": user1 - user0, "sys_s": sys1 - sys0,
            "cpu_s_per_gib": m.cpu_s / gib, "mb_s": mb_per_s(sent, m.wall_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 MiB, 2 runs (for CI)")
    parser.add_argument("--total-mib", type=int, default=512, help="log size to serve (default 512 MiB)")
    parser.add_argument("--fetch-kib", type=int, default=1024, help="bytes per read_slice (default 1 MiB)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; the median is reported")
    parser.add_argument("--dir", type=Path, default=None, help="where the log goes (default under bench/results/)")
    args = parser.parse_args()
    if args.quick:
        args.total_mib, args.repeat = 64, 2

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="sendfile-", dir=args.dir or RESULTS_DIR))
    fetch_bytes = args.fetch_kib * 1024
    try:
        log, size = build_log(data_dir / "log", args.total_mib * MIB)
        offsets = fetch_offsets(log, fetch_bytes)
        print(f"serving {size / MIB:,.0f} MiB in {len(offsets)} fetches of <= {args.fetch_kib} KiB over "
              f"loopback TCP ({args.repeat} runs, median); sender thread CPU only", flush=True)
        runs: dict[str, list[dict]] = {"sendfile": [], "copy": []}
        for r in range(args.repeat):
            for method in (("copy", "sendfile") if r % 2 == 0 else ("sendfile", "copy")):
                runs[method].append(serve(log, offsets, fetch_bytes, method))
        log.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)

    summary = {}
    for method, results in runs.items():
        summary[method] = {
            "cpu_s_per_gib": median([x["cpu_s_per_gib"] for x in results]),
            "mb_s": median([x["mb_s"] for x in results]),
            "user_s": median([x["user_s"] for x in results]),
            "sys_s": median([x["sys_s"] for x in results]),
        }
        print_row(method, cpu_s_per_gib=summary[method]["cpu_s_per_gib"],
                  mb_s=summary[method]["mb_s"], user_s=summary[method]["user_s"], sys_s=summary[method]["sys_s"])
    ratio = print_ratio("sender CPU per GiB, sendfile/copy", summary["sendfile"]["cpu_s_per_gib"],
                        summary["copy"]["cpu_s_per_gib"], "CPU s/GiB", target=1.0, higher_is_better=False)
    print_ratio("throughput, sendfile/copy", summary["sendfile"]["mb_s"], summary["copy"]["mb_s"], "MB/s")
    params = {"total_mib": args.total_mib, "bytes": size, "fetch_kib": args.fetch_kib, "repeat": args.repeat,
              "quick": args.quick, "batch_bytes_approx": BATCH_RECORDS * RECORD_BYTES}
    path = write_results("sendfile_quick" if args.quick else "sendfile", params,
                         {"summary": summary, "cpu_ratio_sendfile_over_copy": ratio, "runs": runs}, data_dir.parent)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
