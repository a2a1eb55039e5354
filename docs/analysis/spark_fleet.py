# Spark (local mode here; the same code on a cluster) over a fleet copy.
# Spark discovers node= and date= as partition columns, and a filter on them
# prunes directories before any file is listed or read: the plan shows it
# under PartitionFilters.
import os

from pyspark.sql import SparkSession

FLEET = os.environ.get("VTAX_FLEET", "/mnt/vtax-fleet")
NODE = os.environ.get("VTAX_NODE", "gpu-node-17")

spark = (
    SparkSession.builder.master("local[1]")
    .appName("vtax-fleet")
    .config("spark.sql.session.timeZone", "UTC")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "4")
    .getOrCreate()
)
gpu = spark.read.option("mergeSchema", "true").parquet(f"{FLEET}/tables/gpu")
gpu.createOrReplaceTempView("gpu")

query = f"""
    SELECT node, gpu,
           avg(utilization_ratio)                                AS busy,
           avg(hbm_bytes_per_second / hbm_peak_bytes_per_second) AS hbm_of_peak,
           count(*)                                              AS samples
    FROM gpu
    WHERE node = '{NODE}' AND date >= date_sub(current_date(), 1)
    GROUP BY node, gpu ORDER BY gpu
"""
per_gpu = spark.sql(query).collect()
for row in per_gpu:
    print(row)

plan = spark.sql(f"EXPLAIN FORMATTED {query}").first()[0]
print(plan)
# The files the rows came from, after pruning: that node's only.
where = f"node = '{NODE}' AND date >= date_sub(current_date(), 1)"
files = [r.file_path for r in gpu.where(where).select("_metadata.file_path").distinct().collect()]
print(f"{len(files)} file(s) read")
spark.stop()
