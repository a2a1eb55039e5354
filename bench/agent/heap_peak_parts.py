#!/usr/bin/env python3
"""Bytes live at a heaptrack profile's peak, by the part of the code that holds them.

heaptrack_print writes the peak's allocations as stacks (`--flamegraph-cost-type peak
--print-flamegraph FILE`, one `frame;frame;... bytes` line each). Each stack goes to the
first PART whose pattern one of its frames contains; the rest are summed as "other".

    heaptrack -o /tmp/ht/heap target/release/examples/merge_memory --hours 24 --series 50
    heaptrack_print -f /tmp/ht/heap.zst --flamegraph-cost-type peak --print-flamegraph /tmp/ht/fg.txt
    python3 bench/agent/heap_peak_parts.py /tmp/ht/fg.txt
"""
import sys

# (what it is, a frame that marks it); first match wins, so the narrowest come first.
PARTS = [
    ("decompressed input pages", "decode_page"),
    ("ZSTD compression context", "ZSTD_resetCCtx_internal"),
    ("ZSTD decompression contexts", "ZSTD_createDCtx"),
    ("the writer: column chunk and page buffers", "add_data_page"),
    ("write-ahead log buffer", "WalWriter"),
    ("input file metadata", "ArrowReaderMetadata"),
]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    totals = {name: 0 for name, _ in PARTS}
    other = 0
    with open(sys.argv[1]) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            part = next((name for name, frame in PARTS if frame in stack), None)
            if part is None:
                other += int(count)
            else:
                totals[part] += int(count)
    for name, count in sorted(totals.items(), key=lambda t: -t[1]):
        print(f"{count / 1e6:6.2f} MB  {name}")
    print(f"{other / 1e6:6.2f} MB  other")
    print(f"{(sum(totals.values()) + other) / 1e6:6.2f} MB  in all at the peak")


if __name__ == "__main__":
    main()
