"""Append throughput of gregor_native.Log.append_as_leader against a raw sequential
os.write of the same bytes to a file in the same directory.

1 KiB records in 16 KiB and 1 MiB batches; three durability variants:
  page cache   appends only, nothing forced to disk
  fsync end    appends, then one flush()/fsync() inside the timed block
  fsync every  flush.messages=1 (the engine fsyncs after every append) vs
               os.write + os.fsync per batch; on a smaller total, since every
               fsync waits for the device
Prints MB/s for each and the ratio native/raw (target >= 0.8), and writes
bench/results/native_append.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gregor_native as native  # noqa: E402

from common import MIB, RESULTS_DIR, mb_per_s, measure, median, print_ratio, print_row, write_results  # noqa: E402

RECORD_BYTES = 1024
TARGET_RATIO = 0.8


def make_batches(batch_bytes: int, distinct: int = 8) -> list[bytes]:
    """`distinct` different batches of 1 KiB records, as many as fit in batch_bytes
    (a 1 MiB batch must stay within the default max.message.bytes)."""
    record_size = len(native.encode_records([(None, bytes(RECORD_BYTES), [], 0)]))
    count = max(1, (batch_bytes - native.BATCH_HEADER_SIZE) // record_size)
    batches = []
    for i in range(distinct):
        while True:  # offset deltas above 63 take 2-byte varints: trim to fit
            values = [os.urandom(RECORD_BYTES) for _ in range(count)]
            section = native.encode_records([(None, v, [], 0) for v in values])
            if count == 1 or native.BATCH_HEADER_SIZE + len(section) <= batch_bytes:
                break
            count -= 1 + (native.BATCH_HEADER_SIZE + len(section) - batch_bytes) // record_size
        batches.append(native.build_batch(section, count, base_timestamp=1_700_000_000_000 + i,
                                          max_timestamp=1_700_000_000_000 + i))
    return batches


def run_raw(path: Path, batches: list[bytes], n: int, fsync: str) -> tuple[float, float]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    k = len(batches)
    try:
        with measure() as m:
            for i in range(n):
                os.write(fd, batches[i % k])
                if fsync == "every":
                    os.fsync(fd)
            if fsync == "end":
                os.fsync(fd)
    finally:
        os.close(fd)
    return m.wall_s, m.cpu_s


def run_native(path: Path, batches: list[bytes], n: int, fsync: str) -> tuple[float, float]:
    config = native.LogConfig(flush_messages=1) if fsync == "every" else native.LogConfig()
    log = native.Log(str(path), config)
    k = len(batches)
    try:
        with measure() as m:
            for i in range(n):
                log.append_as_leader(batches[i % k], 0)
            if fsync == "end":
                log.flush()
    finally:
        log.close()
    return m.wall_s, m.cpu_s


def bench_case(data_dir: Path, batch_bytes: int, total_bytes: int, fsync: str, repeat: int) -> dict:
    batches = make_batches(batch_bytes)
    size = len(batches[0])
    n = max(1, total_bytes // size)
    nbytes = n * size
    raw_mbs, native_mbs, raw_cpu, native_cpu = [], [], [], []
    for r in range(repeat):
        # Alternate the order so neither side always runs on a warmer machine.
        order = ("raw", "native") if r % 2 == 0 else ("native", "raw")
        for side in order:
            target = data_dir / f"{side}-{r}"
            # Start every timed run with no dirty pages left by the previous side: otherwise the
            # side that runs second pays for the first one's writeback (and with 3 runs in
            # alternating order native runs second twice).
            os.sync()
            if side == "raw":
                wall, cpu = run_raw(target, batches, n, fsync)
                raw_mbs.append(mb_per_s(nbytes, wall))
                raw_cpu.append(cpu)
                target.unlink()
            else:
                wall, cpu = run_native(target, batches, n, fsync)
                native_mbs.append(mb_per_s(nbytes, wall))
                native_cpu.append(cpu)
                shutil.rmtree(target)
    result = {
        "batch_bytes": size, "batches": n, "bytes": nbytes, "fsync": fsync,
        "raw_mb_s": median(raw_mbs), "native_mb_s": median(native_mbs),
        "raw_cpu_s": median(raw_cpu), "native_cpu_s": median(native_cpu),
        "raw_mb_s_runs": raw_mbs, "native_mb_s_runs": native_mbs,
    }
    result["ratio"] = result["native_mb_s"] / result["raw_mb_s"]
    label = f"append {batch_bytes // 1024} KiB batches, {fsync_label(fsync)}, {nbytes / MIB:,.0f} MiB"
    print(label, flush=True)
    print_row("raw os.write", mb_s=result["raw_mb_s"], cpu_s=result["raw_cpu_s"])
    print_row("native append_as_leader", mb_s=result["native_mb_s"], cpu_s=result["native_cpu_s"])
    print_ratio("  native/raw", result["native_mb_s"], result["raw_mb_s"], "MB/s",
                target=TARGET_RATIO)
    return result


def fsync_label(fsync: str) -> str:
    return {"none": "page cache", "end": "fsync at end", "every": "fsync every batch"}[fsync]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes for CI (32 MiB, 4 MiB with fsync every)")
    parser.add_argument("--total-mib", type=int, default=512, help="bytes per run (default 512 MiB)")
    parser.add_argument("--fsync-every-mib", type=int, default=64, help="bytes per run of the fsync-every variant")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side; the median is reported")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write (default: a temporary dir under bench/results/)")
    parser.add_argument("--case", action="append", default=None, metavar="KIB:FSYNC",
                        help="run only this case, e.g. 1024:none (repeatable; fsync is none, end or every)")
    args = parser.parse_args()
    if args.quick:
        args.total_mib, args.fsync_every_mib, args.repeat = 32, 4, 2

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="append-", dir=args.dir or RESULTS_DIR))
    print(f"native append vs raw os.write in {data_dir} "
          f"({args.total_mib} MiB per run, {args.repeat} runs, median)", flush=True)
    results = []
    try:
        for batch_bytes in (16 * 1024, MIB):
            for fsync in ("none", "end", "every"):
                if args.case and f"{batch_bytes // 1024}:{fsync}" not in args.case:
                    continue
                total = (args.fsync_every_mib if fsync == "every" else args.total_mib) * MIB
                results.append(bench_case(data_dir, batch_bytes, total, fsync, args.repeat))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    params = {"record_bytes": RECORD_BYTES, "total_mib": args.total_mib, "fsync_every_mib": args.fsync_every_mib,
              "repeat": args.repeat, "quick": args.quick, "target_ratio": TARGET_RATIO}
    path = write_results("native_append_quick" if args.quick else "native_append", params, results, data_dir.parent)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
