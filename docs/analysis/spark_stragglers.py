# Which node held the job back, in Spark (local mode here; the same code on a
# cluster): the twin of duckdb_stragglers.py, the same signals, groups, floors
# and z. VTAX_PEER_GROUPS and VTAX_DAYS as there. The date filter prunes
# partitions: only the days asked for are listed and read.
import os
import re

from pyspark.sql import SparkSession

FLEET = os.environ.get("VTAX_FLEET", "/mnt/vtax-fleet")
DAYS = int(os.environ.get("VTAX_DAYS", "1"))
NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


def peer_group_sql(spec):
    """VTAX_PEER_GROUPS as a CASE over the node column."""
    cases = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        group, _, nodes = part.partition("=")
        for name in [group.strip()] + [n.strip() for n in nodes.split(",")]:
            if not NAME.match(name):
                raise SystemExit(f"VTAX_PEER_GROUPS: {name!r} is not a group or node name "
                                 "(letters, digits, '-', '.' and '_'; 'group=node,node;group=node')")
        cases += [f"WHEN '{n.strip()}' THEN '{group.strip()}'" for n in nodes.split(",")]
    return f"CASE node {' '.join(cases)} ELSE 'fleet' END" if cases else "'fleet'"


spark = (
    SparkSession.builder.master("local[1]")
    .appName("vtax-stragglers")
    .config("spark.sql.session.timeZone", "UTC")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "4")
    .getOrCreate()
)
for name in ["gpu", "cpu", "jitter", "infiniband_port"]:
    if os.path.isdir(f"{FLEET}/tables/{name}") or "://" in FLEET:
        spark.read.option("mergeSchema", "true").parquet(f"{FLEET}/tables/{name}") \
            .createOrReplaceTempView(name)
    else:
        # A fleet without the table (no InfiniBand anywhere): no rows of it.
        spark.sql("SELECT * FROM VALUES (CAST(NULL AS STRING)) AS t(node) WHERE false").createOrReplaceTempView(name)
RECENT = f"date >= date_sub(current_date(), {DAYS})"
ELAPSED = "(unix_micros(time) - unix_micros(lag(time) OVER w)) / 1e6"

scores = spark.sql(f"""
    WITH gpu_hour AS (
        SELECT node, date_trunc('HOUR', time) AS hour, gpu,
               avg(sm_clock_hertz / nullif(sm_clock_max_hertz, 0)) FILTER (WHERE utilization_ratio >= 0.5) AS sm,
               avg(hbm_bytes_per_second / nullif(hbm_peak_bytes_per_second, 0))
                   FILTER (WHERE utilization_ratio >= 0.5) AS hbm,
               sum(nvlink_links_up) AS links_up, sum(nvlink_links_product) AS links_product
        FROM gpu WHERE {RECENT} GROUP BY 1, 2, 3
    ), cpu_step AS (
        -- Growth from each sample to the next, a step that goes back (a
        -- reboot) left out, as in duckdb_stragglers.py.
        SELECT node, date_trunc('HOUR', time) AS hour, cpu,
               steal_seconds - lag(steal_seconds) OVER w AS grown, {ELAPSED} AS elapsed
        FROM cpu WHERE {RECENT}
        WINDOW w AS (PARTITION BY node, cpu ORDER BY time)
    ), cpu_hour AS (
        SELECT node, hour, cpu, sum(grown) / nullif(sum(elapsed), 0) AS steal
        FROM cpu_step WHERE grown >= 0 GROUP BY 1, 2, 3
    ), jitter_hour AS (
        SELECT node, date_trunc('HOUR', time) AS hour, cpu, avg(wakeup_p99_seconds) AS p99
        FROM jitter WHERE {RECENT} GROUP BY 1, 2, 3
    ), port_step AS (
        SELECT node, date_trunc('HOUR', time) AS hour, device, port,
               CAST(xmit_wait AS DOUBLE) - lag(CAST(xmit_wait AS DOUBLE)) OVER w AS grown,
               {ELAPSED} AS elapsed
        FROM infiniband_port WHERE {RECENT}
        WINDOW w AS (PARTITION BY node, device, port ORDER BY time)
    ), port_hour AS (
        SELECT node, hour, device, port, sum(grown) / nullif(sum(elapsed), 0) AS xmit_wait
        FROM port_step WHERE grown >= 0 GROUP BY 1, 2, 3, 4
    ), node_signal AS (
        SELECT node, hour, 'sm_clock_ratio' AS signal, min(sm) AS value FROM gpu_hour GROUP BY 1, 2
        UNION ALL SELECT node, hour, 'hbm_peak_ratio', min(hbm) FROM gpu_hour GROUP BY 1, 2
        UNION ALL SELECT node, hour, 'nvlink_links_up_ratio', sum(links_up) / nullif(sum(links_product), 0)
                  FROM gpu_hour GROUP BY 1, 2
        UNION ALL SELECT node, hour, 'jitter_wakeup_p99_seconds', max(p99) FROM jitter_hour GROUP BY 1, 2
        UNION ALL SELECT node, hour, 'steal_ratio', avg(steal) FROM cpu_hour GROUP BY 1, 2
        UNION ALL SELECT node, hour, 'infiniband_xmit_wait_per_second', max(xmit_wait) FROM port_hour GROUP BY 1, 2
    ), signals AS (
        SELECT * FROM VALUES ('sm_clock_ratio', 'low', 0.01D), ('hbm_peak_ratio', 'low', 0.02D),
                             ('nvlink_links_up_ratio', 'low', 0.001D), ('jitter_wakeup_p99_seconds', 'high', 2e-5D),
                             ('steal_ratio', 'high', 0.002D), ('infiniband_xmit_wait_per_second', 'high', 1e5D)
            AS f(signal, bad_when, mad_floor)
    ), grouped AS (
        SELECT {peer_group_sql(os.environ.get('VTAX_PEER_GROUPS', ''))} AS peer_group, s.*, f.bad_when, f.mad_floor
        FROM node_signal s JOIN signals f USING (signal)
        WHERE value IS NOT NULL
    ), peers AS (
        SELECT *, count(*) OVER w AS nodes, percentile(value, 0.5) OVER w AS median
        FROM grouped WINDOW w AS (PARTITION BY peer_group, hour, signal)
    ), spread AS (
        SELECT *, percentile(abs(value - median), 0.5) OVER (PARTITION BY peer_group, hour, signal) AS mad
        FROM peers
    )
    SELECT peer_group, hour, node, signal, value, median, nodes,
           CASE WHEN nodes >= 3 THEN
               (CASE bad_when WHEN 'low' THEN median - value ELSE value - median END)
                   / (1.4826 * greatest(mad, mad_floor))
           END AS z
    FROM spread
""")
scores.createOrReplaceTempView("scores")

# The hour as UTC wall time (TIMESTAMP_NTZ): a TIMESTAMP is handed to Python
# in the driver's local time zone, whatever the session's.
ranking = spark.sql("""
    SELECT peer_group, CAST(hour AS TIMESTAMP_NTZ) AS hour, node,
           max_by(signal, z) AS why, max(z) AS z,
           max_by(value, z) AS value, max_by(median, z) AS median
    FROM scores WHERE z IS NOT NULL
    GROUP BY 1, 2, 3
    ORDER BY peer_group, hour, z DESC, node
""").collect()
for row in ranking:
    print(row)

# The plan: each table read lists only the days asked for (PartitionFilters).
plan = spark.sql("EXPLAIN FORMATTED SELECT * FROM scores").first()[0]
print(plan)
scores = scores.collect()
spark.stop()
