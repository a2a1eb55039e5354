# Polars over a fleet copy: lazy scans with Hive partitions, so the date and
# time filters reach the reader and only the columns used are decoded.
import os
from datetime import datetime, timedelta, timezone

import polars as pl

FLEET = os.environ.get("VTAX_FLEET", "/mnt/vtax-fleet")
since = datetime.now(timezone.utc) - timedelta(hours=1)

gpu = pl.scan_parquet(f"{FLEET}/tables/gpu/**/*.parquet", hive_partitioning=True)
per_gpu = (
    gpu.filter(pl.col("date") >= since.date(), pl.col("time") >= since)
    .group_by("node", "gpu")
    .agg(
        busy=pl.col("utilization_ratio").mean(),
        hbm_of_peak=(pl.col("hbm_bytes_per_second") / pl.col("hbm_peak_bytes_per_second")).mean(),
        samples=pl.len(),
    )
    .sort("node", "gpu")
    .collect()
)
print(per_gpu)

# Jitter p99 per node and minute: the worst CPU of each minute.
jitter = pl.scan_parquet(f"{FLEET}/tables/jitter/**/*.parquet", hive_partitioning=True)
p99_per_minute = (
    jitter.filter(pl.col("date") >= since.date(), pl.col("time") >= since)
    .group_by("node", pl.col("time").dt.truncate("1m").alias("minute"))
    .agg(p99_us=pl.col("wakeup_p99_seconds").max() * 1e6)
    .sort("node", "minute")
    .collect()
)
print(p99_per_minute)
