# DuckDB over one node's store: GPU busy and HBM against peak, jitter p99
# over time, steal. Run it beside the agent (it only reads), or on a copy.
import os

import duckdb

STORE = os.environ.get("VTAX_STORE", "/var/lib/vtax")
con = duckdb.connect()


def table(name):
    # hive_partitioning makes `date` a column: a filter on it skips whole days
    # before any file is opened; a filter on `time` skips hours inside a day
    # through the files' row-group and page statistics.
    return f"read_parquet('{STORE}/tables/{name}/*/*.parquet', hive_partitioning = true, union_by_name = true)"


# Per GPU over the last hour: how often a kernel ran, and HBM bandwidth
# against the GPU's peak (3.35 TB/s on an H100 SXM).
gpu = con.sql(f"""
    SELECT gpu,
           avg(utilization_ratio)                                AS busy,
           avg(hbm_bytes_per_second / hbm_peak_bytes_per_second) AS hbm_of_peak,
           max(hbm_bytes_per_second) / 1e12                      AS hbm_max_tb_per_s,
           count(*)                                              AS samples
    FROM {table('gpu')}
    WHERE date >= current_date - 1 AND time >= now() - INTERVAL 1 HOUR
    GROUP BY gpu ORDER BY gpu
""")
gpu.show()

# Wake-up latency p99 per minute: the worst CPU of each minute, in microseconds.
jitter = con.sql(f"""
    SELECT time_bucket(INTERVAL 1 MINUTE, time) AS minute,
           max(wakeup_p99_seconds) * 1e6        AS p99_us,
           max(wakeup_max_seconds) * 1e6        AS max_us,
           sum(stalls_over_500us)               AS stalls_over_500us
    FROM {table('jitter')}
    WHERE date >= current_date - 1 AND time >= now() - INTERVAL 1 HOUR
    GROUP BY minute ORDER BY minute
""")
jitter.show()

# Steal per CPU: counters are stored raw, so the share is the counter's
# growth over the elapsed time (a decrease is a reboot and is skipped).
steal = con.sql(f"""
    WITH deltas AS (
        SELECT cpu,
               steal_seconds - lag(steal_seconds) OVER w AS stolen,
               epoch(time - lag(time) OVER w)            AS elapsed
        FROM {table('cpu')}
        WHERE date >= current_date - 1 AND time >= now() - INTERVAL 1 HOUR
        WINDOW w AS (PARTITION BY cpu ORDER BY time)
    )
    SELECT cpu, sum(stolen) / sum(elapsed) AS steal_share
    FROM deltas WHERE stolen >= 0
    GROUP BY cpu ORDER BY cpu::INTEGER
""")
steal.show()
