# DuckDB over a fleet copy (tables/<table>/node=<node>/date=.../), as the
# uploader lays it out in object storage: per-node comparison and stragglers.
# For S3, `INSTALL httpfs; LOAD httpfs;` and an s3:// path work the same way.
import os

import duckdb

FLEET = os.environ.get("VTAX_FLEET", "/mnt/vtax-fleet")
con = duckdb.connect()


def table(name):
    # Two partition levels, node= and date=: both become columns.
    return f"read_parquet('{FLEET}/tables/{name}/*/*/*.parquet', hive_partitioning = true, union_by_name = true)"


# One row per node: GPUs, how busy, and while busy (utilisation >= 0.5, as
# the vtax-peers rules take them) HBM against peak and SM clock against its
# maximum (throttling shows here; an idle GPU clocks down by design), and
# the jitter tail.
BUSY = "FILTER (utilization_ratio >= 0.5)"
per_node = con.sql(f"""
    WITH g AS (
        SELECT node,
               count(DISTINCT gpu)                                          AS gpus,
               avg(utilization_ratio)                                       AS busy,
               avg(hbm_bytes_per_second / hbm_peak_bytes_per_second) {BUSY} AS hbm_of_peak,
               avg(sm_clock_hertz / sm_clock_max_hertz) {BUSY}              AS clock_of_max
        FROM {table('gpu')}
        WHERE date >= current_date - 1
        GROUP BY node
    ), j AS (
        SELECT node,
               median(wakeup_p99_seconds) * 1e6 AS p99_us,
               max(wakeup_max_seconds) * 1e6    AS max_us
        FROM {table('jitter')}
        WHERE date >= current_date - 1
        GROUP BY node
    )
    SELECT * FROM g LEFT JOIN j USING (node) ORDER BY node
""")
per_node.show()

# Stragglers: nodes whose HBM bandwidth against peak while busy trails the
# fleet's median by more than 10%. In a synchronous job the slowest node sets
# the pace. Idle seconds are left out: with them, a node that rebooted or
# waited for its job would read as slow, and its idle time would pull the
# median down under the node that is.
stragglers = con.sql(f"""
    WITH per_node AS (
        SELECT node,
               avg(hbm_bytes_per_second / hbm_peak_bytes_per_second) AS hbm_of_peak,
               avg(sm_clock_hertz / sm_clock_max_hertz)              AS clock_of_max
        FROM {table('gpu')}
        WHERE date >= current_date - 1 AND utilization_ratio >= 0.5
        GROUP BY node
    )
    SELECT node, hbm_of_peak, clock_of_max,
           hbm_of_peak / median(hbm_of_peak) OVER () AS of_fleet_median
    FROM per_node
    QUALIFY of_fleet_median < 0.9
    ORDER BY of_fleet_median
""")
stragglers.show()
