#!/usr/bin/env python3
"""What a decimal value column would buy against VictoriaMetrics, and what it costs.

The store keeps `scraped.value` as one DOUBLE column, so every reader gets the exact
f64 with `SELECT value`. VictoriaMetrics instead turns each float into a decimal
mantissa and exponent and delta-codes the mantissas. This study rewrites a vtax store's
`scraped` rows both ways with pyarrow, on the store's own layout (rows sorted by series
then time, 100k rows a page, 1M rows a row group), and prints bytes per sample:

- `double`: the layout vtax writes today (PLAIN and BYTE_STREAM_SPLIT values);
- `split`: `value_mantissa` INT64 + `value_scale` INT8 wherever the f64 is exactly
  `mantissa / 10**scale` (IEEE division, so the value comes back bit for bit), and
  `value` DOUBLE only for the rest (NaN, infinities, 17-digit values). A series keeps
  one scale where it can, so its mantissas delta-code.

It then proves the split form lossless through the reader a user would write:
DuckDB's `coalesce(value, value_mantissa / 10^value_scale)` compared bit for bit with
the stored DOUBLE.

    vtax import --data-dir DIR INPUT.om
    python3 bench/size/split_value_study.py DIR [--levels 3,9,19]
"""

import argparse
import glob
import math
import os
import struct
import sys
import tempfile
from decimal import Decimal

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

# The largest integer a double holds exactly, and the largest exact power of ten.
EXACT_INT_LIMIT = 2**53
EXACT_POW10_MAX = 22
TAGS = ["target", "metric", "labels"]


def shortest_decimal(value):
    """(mantissa, scale) of the shortest decimal that round-trips `value`, or None."""
    if not math.isfinite(value):
        return None
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    mantissa = int("".join(map(str, digits))) * (-1 if sign else 1)
    if exponent > 0:
        mantissa *= 10**exponent
        exponent = 0
    scale = -exponent
    if abs(mantissa) >= EXACT_INT_LIMIT or scale > EXACT_POW10_MAX:
        return None
    return mantissa, scale


def bits(value):
    return struct.pack("<d", value)


def split_values(values, series_keys):
    """Mantissa, scale and leftover-double lists, one scale per series where exact."""
    count = len(values)
    mantissas, scales, leftovers = [None] * count, [None] * count, [None] * count
    start = 0
    while start < count:
        end = start
        while end < count and series_keys[end] == series_keys[start]:
            end += 1
        decimals = [shortest_decimal(v) if v is not None else None for v in values[start:end]]
        common = max((d[1] for d in decimals if d), default=0)
        for row in range(start, end):
            value, decimal = values[row], decimals[row - start]
            if decimal is not None:
                mantissa, scale = decimal
                widened = mantissa * 10 ** (common - scale)
                if abs(widened) < EXACT_INT_LIMIT and bits(widened / 10.0**common) == bits(value):
                    mantissas[row], scales[row] = widened, common
                    continue
                if bits(mantissa / 10.0**scale) == bits(value):
                    mantissas[row], scales[row] = mantissa, scale
                    continue
            leftovers[row] = value
        start = end
    return mantissas, scales, leftovers


def written_size(table, level, encodings, dictionary):
    with tempfile.NamedTemporaryFile(suffix=".parquet") as out:
        pq.write_table(
            table,
            out.name,
            compression="zstd",
            compression_level=level,
            row_group_size=1_000_000,
            data_page_size=1 << 28,
            max_rows_per_page=100_000,
            write_batch_size=100_000,
            use_dictionary=dictionary,
            column_encoding=encodings,
        )
        return os.path.getsize(out.name)


def check_lossless(split_table, original):
    con = duckdb.connect()
    con.register("split_rows", split_table)
    restored = con.sql(
        "SELECT coalesce(value, value_mantissa / 10.0 ^ value_scale) AS v FROM split_rows"
    ).to_arrow_table().column("v").to_pylist()
    wrong = sum(
        1
        for got, want in zip(restored, original)
        if (got is None) != (want is None) or (want is not None and bits(got) != bits(want))
    )
    return wrong


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_dir")
    parser.add_argument("--levels", default="3,9,19", help="ZSTD levels to try")
    args = parser.parse_args()

    files = sorted(glob.glob(os.path.join(args.data_dir, "tables", "scraped", "**", "*.parquet"), recursive=True))
    if not files:
        sys.exit(f"no scraped files under {args.data_dir}/tables/scraped")
    table = pa.concat_tables(pq.read_table(f) for f in files)
    # Tags come back dictionary-encoded, which pyarrow cannot sort by.
    for tag in TAGS:
        table = table.set_column(table.schema.get_field_index(tag), tag, table.column(tag).cast(pa.string()))
    table = table.sort_by([(t, "ascending") for t in TAGS] + [("time", "ascending")])
    samples = table.num_rows
    values = table.column("value").to_pylist()
    series_keys = list(zip(*(table.column(t).to_pylist() for t in TAGS)))
    mantissas, scales, leftovers = split_values(values, series_keys)
    split = (
        table.drop_columns(["value"])
        .append_column("value_mantissa", pa.array(mantissas, pa.int64()))
        .append_column("value_scale", pa.array(scales, pa.int8()))
        .append_column("value", pa.array(leftovers, pa.float64()))
    )
    leftover_count = sum(v is not None for v in leftovers)
    print(f"{samples} samples in {len(files)} file(s); {leftover_count} ({100 * leftover_count / samples:.2f}%) not a short decimal")
    print(f"vtax's own files: {sum(os.path.getsize(f) for f in files) / samples:.3f} B/sample")
    print(f"split form restored through DuckDB: {check_lossless(split, values)} values differ")

    variants = [
        ("double, PLAIN", table, {"time": "DELTA_BINARY_PACKED", "value": "PLAIN"}, TAGS),
        ("double, BYTE_STREAM_SPLIT", table, {"time": "DELTA_BINARY_PACKED", "value": "BYTE_STREAM_SPLIT"}, TAGS),
        ("split, mantissa BYTE_STREAM_SPLIT", split,
         {"time": "DELTA_BINARY_PACKED", "value_mantissa": "BYTE_STREAM_SPLIT", "value": "PLAIN"}, TAGS + ["value_scale"]),
        ("split, mantissa DELTA_BINARY_PACKED", split,
         {"time": "DELTA_BINARY_PACKED", "value_mantissa": "DELTA_BINARY_PACKED", "value": "PLAIN"}, TAGS + ["value_scale"]),
    ]
    levels = [int(level) for level in args.levels.split(",")]
    print("| layout | " + " | ".join(f"ZSTD {level}" for level in levels) + " |")
    print("|---|" + "---:|" * len(levels))
    for name, data, encodings, dictionary in variants:
        sizes = [written_size(data, level, encodings, dictionary) / samples for level in levels]
        print(f"| {name} | " + " | ".join(f"{size:.3f}" for size in sizes) + " |")


if __name__ == "__main__":
    main()
