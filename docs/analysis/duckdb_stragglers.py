# Which node held the job back: per peer group and hour, each node's signals
# against the group's median, as the vtax-peers rules compare them live
# (dashboards/alerts/vtax-rules.yml), over a fleet copy in DuckDB. A node's
# value is its worst GPU, CPU or port over the hour; the robust z is
# (median - value) / (1.4826 * MAD) for a signal that is bad when low, the
# other way round when high, so positive is worse; the MAD is floored as the
# rules floor it; a group of fewer than 3 nodes gets no z.
#
# The fleet copy has no cluster column: VTAX_PEER_GROUPS maps nodes to groups,
# "pod-1=gpu-node-1,gpu-node-2;pod-2=gpu-node-3"; nodes it does not name, and
# every node when it is unset, form the group "fleet". VTAX_DAYS (default 1)
# says how many days back to read.
import os
import re

import duckdb

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


def table(name):
    return (f"(SELECT * FROM read_parquet('{FLEET}/tables/{name}/*/*/*.parquet', hive_partitioning = true, union_by_name = true) "
            f"WHERE date >= current_date - {DAYS})")


# Per signal: what a node's value is bad when, and the MAD's floor (the rules').
SIGNALS = """(VALUES ('sm_clock_ratio', 'low', 0.01), ('hbm_peak_ratio', 'low', 0.02),
                     ('nvlink_links_up_ratio', 'low', 0.001), ('jitter_wakeup_p99_seconds', 'high', 2e-5),
                     ('steal_ratio', 'high', 0.002), ('infiniband_xmit_wait_per_second', 'high', 1e5))
             AS f(signal, bad_when, mad_floor)"""

con = duckdb.connect()
# Hours in UTC, as Spark's session counts them.
con.execute("SET TimeZone = 'UTC'")
scores = con.sql(f"""
    WITH gpu_hour AS (
        -- Clock and HBM while busy, as the rules take them (utilisation >= 0.5).
        SELECT node, date_trunc('hour', time) AS hour, gpu,
               avg(sm_clock_hertz / nullif(sm_clock_max_hertz, 0)) FILTER (utilization_ratio >= 0.5) AS sm,
               avg(hbm_bytes_per_second / nullif(hbm_peak_bytes_per_second, 0))
                   FILTER (utilization_ratio >= 0.5) AS hbm,
               sum(nvlink_links_up) AS links_up, sum(nvlink_links_product) AS links_product
        FROM {table('gpu')} GROUP BY ALL
    ), cpu_step AS (
        -- A counter's growth from each sample to the next, in the hour of the
        -- later one. A step where it went back (the node rebooted) is left
        -- out: a max less a min would read the boot before as steal.
        SELECT node, date_trunc('hour', time) AS hour, cpu,
               steal_seconds - lag(steal_seconds) OVER w AS grown,
               epoch(time) - epoch(lag(time) OVER w) AS elapsed
        FROM {table('cpu')}
        WINDOW w AS (PARTITION BY node, cpu ORDER BY time)
    ), cpu_hour AS (
        SELECT node, hour, cpu, sum(grown) / nullif(sum(elapsed), 0) AS steal
        FROM cpu_step WHERE grown >= 0 GROUP BY ALL
    ), jitter_hour AS (
        SELECT node, date_trunc('hour', time) AS hour, cpu, avg(wakeup_p99_seconds) AS p99
        FROM {table('jitter')} GROUP BY ALL
    ), port_step AS (
        -- As cpu_step: a port's counters go back when they are reset or the
        -- node reboots.
        SELECT node, date_trunc('hour', time) AS hour, device, port,
               xmit_wait::DOUBLE - lag(xmit_wait::DOUBLE) OVER w AS grown,
               epoch(time) - epoch(lag(time) OVER w) AS elapsed
        FROM {table('infiniband_port')}
        WINDOW w AS (PARTITION BY node, device, port ORDER BY time)
    ), port_hour AS (
        SELECT node, hour, device, port, sum(grown) / nullif(sum(elapsed), 0) AS xmit_wait
        FROM port_step WHERE grown >= 0 GROUP BY ALL
    ), node_signal AS (
        SELECT node, hour, 'sm_clock_ratio' AS signal, min(sm) AS value FROM gpu_hour GROUP BY ALL
        UNION ALL SELECT node, hour, 'hbm_peak_ratio', min(hbm) FROM gpu_hour GROUP BY ALL
        UNION ALL SELECT node, hour, 'nvlink_links_up_ratio', sum(links_up) / nullif(sum(links_product), 0)
                  FROM gpu_hour GROUP BY ALL
        UNION ALL SELECT node, hour, 'jitter_wakeup_p99_seconds', max(p99) FROM jitter_hour GROUP BY ALL
        UNION ALL SELECT node, hour, 'steal_ratio', avg(steal) FROM cpu_hour GROUP BY ALL
        UNION ALL SELECT node, hour, 'infiniband_xmit_wait_per_second', max(xmit_wait) FROM port_hour GROUP BY ALL
    ), peers AS (
        SELECT {peer_group_sql(os.environ.get('VTAX_PEER_GROUPS', ''))} AS peer_group, s.*, f.bad_when, f.mad_floor,
               count(*) OVER w AS nodes, median(value) OVER w AS median
        FROM node_signal s JOIN {SIGNALS} USING (signal)
        WHERE value IS NOT NULL
        WINDOW w AS (PARTITION BY peer_group, hour, signal)
    ), spread AS (
        SELECT *, median(abs(value - median)) OVER (PARTITION BY peer_group, hour, signal) AS mad FROM peers
    )
    SELECT peer_group, hour, node, signal, value, median, nodes,
           CASE WHEN nodes >= 3 THEN
               (CASE bad_when WHEN 'low' THEN median - value ELSE value - median END)
                   / (1.4826 * greatest(mad, mad_floor))
           END AS z
    FROM spread
""")

# Per group and hour, the nodes from the worst: which node, when, and why (the
# signal with its largest z, its value and the group's median).
ranking = con.sql("""
    SELECT peer_group, hour, node,
           arg_max(signal, z) AS why, max(z) AS z,
           arg_max(value, z) AS value, arg_max(median, z) AS median
    FROM scores WHERE z IS NOT NULL
    GROUP BY ALL
    ORDER BY peer_group, hour, z DESC, node
""")
ranking.show(max_rows=50)
