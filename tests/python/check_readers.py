"""Reads a vtax store with DuckDB, pyarrow and Polars, and checks every reader
sees exactly the rows a vtax import wrote, values bit for bit.

usage: check_readers.py DATA_DIR EXPECTED.tsv
EXPECTED.tsv: one line per sample: time_us, metric, labels, hex of the f64 bits.
Prints one line per reader; exits non-zero on the first mismatch.
"""
import struct
import sys

import duckdb
import polars as pl
import pyarrow.dataset as ds

data_dir, expected_path = sys.argv[1], sys.argv[2]
glob = f"{data_dir}/tables/scraped/**/*.parquet"


def bits(v):
    return struct.pack("<d", v).hex()


expected = set()
with open(expected_path) as f:
    for line in f:
        t, metric, labels, hexbits = line.rstrip("\n").split("\t")
        expected.add((int(t), metric, labels, hexbits))


def check(name, rows, partitions):
    got = set()
    for t, metric, labels, value in rows:
        got.add((t, metric, labels, bits(value)))
    if len(rows) != len(expected) or got != expected:
        missing = list(expected - got)[:3]
        extra = list(got - expected)[:3]
        print(f"{name}: MISMATCH rows={len(rows)} expected={len(expected)} missing={missing} extra={extra}")
        sys.exit(1)
    print(f"{name}: {len(rows)} rows match bit for bit; partitions seen: {sorted(partitions)}")


# DuckDB: Hive partitioning gives a `date` column; epoch_us keeps microseconds exact.
con = duckdb.connect()
rows = con.execute(
    f"SELECT epoch_us(time) AS t, metric, labels, value, CAST(date AS VARCHAR) AS d "
    f"FROM read_parquet('{glob}', hive_partitioning = true)"
).fetchall()
check("duckdb", [r[:4] for r in rows], {r[4] for r in rows})
# Partition pruning: a filter on the date column reads only that partition.
one_day = sorted({r[4] for r in rows})[0]
n = con.execute(
    f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning = true) WHERE date = '{one_day}'"
).fetchone()[0]
assert n == sum(1 for r in rows if r[4] == one_day), "date partition filter"

# pyarrow dataset with Hive partitioning.
dataset = ds.dataset(f"{data_dir}/tables/scraped", format="parquet", partitioning="hive")
table = dataset.to_table()
times = table.column("time").cast("int64").to_pylist()
rows = list(zip(times, table.column("metric").to_pylist(), table.column("labels").to_pylist(),
                table.column("value").to_pylist()))
check("pyarrow", rows, set(str(d) for d in table.column("date").to_pylist()))
assert str(table.schema.field("time").type) in ("timestamp[us, tz=+00:00]", "timestamp[us, tz=UTC]"), table.schema

# Polars, with Hive partitioning.
frame = pl.scan_parquet(glob, hive_partitioning=True).collect()
rows = list(zip(frame["time"].cast(pl.Int64).to_list(), frame["metric"].to_list(),
                frame["labels"].to_list(), frame["value"].to_list()))
check("polars", rows, set(str(d) for d in frame["date"].to_list()))
