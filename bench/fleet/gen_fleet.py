#!/usr/bin/env python3
"""Writes a synthetic fleet of vtax agents as OpenMetrics, for backfilling with
`promtool tsdb create-blocks-from openmetrics`.

Every node has the series the vtax-peers rules read, shaped as the agent exports
them: per GPU (gpu, gpu_uuid), per CPU (cpu), per InfiniBand port (device, port),
with `instance` and the peer-group label `cluster`. Values carry a little noise
per node; one node per cluster is degraded (its GPU 0's SM clock at 0.7 of the
maximum), so that the rules have something to find.

Usage: gen_fleet.py OUT --nodes 1000 --gpus 8 --cpus 16 --ports 4
       --clusters 4 --start UNIX_S --end UNIX_S --step-secs 15
"""

import argparse
import random
import sys

REASONS = ["sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
           "hw_thermal_slowdown", "hw_power_brake_slowdown"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--cpus", type=int, default=16)
    ap.add_argument("--ports", type=int, default=4)
    ap.add_argument("--clusters", type=int, default=4)
    ap.add_argument("--start", type=int, required=True)
    ap.add_argument("--end", type=int, required=True)
    ap.add_argument("--step-secs", type=int, default=15)
    a = ap.parse_args()
    if a.end <= a.start or a.step_secs <= 0 or a.nodes <= 0 or a.clusters <= 0:
        sys.exit("gen_fleet.py: need end > start, step-secs > 0, nodes > 0, clusters > 0")
    rng = random.Random(35)
    times = list(range(a.start, a.end + 1, a.step_secs))
    stamps = [f" {t}\n" for t in times]
    nodes = [(f"node-{i:04d}", f"c{i % a.clusters}") for i in range(a.nodes)]
    degraded = {n for n, _ in nodes[: a.clusters]}

    out = open(a.out, "w")
    w = out.write

    def gauge(name, per_node):
        # per_node(node, cluster) yields (labels, value) of the node's series
        w(f"# TYPE {name} gauge\n")
        for n, c in nodes:
            for labels, value in per_node(n, c):
                prefix = f'{name}{{cluster="{c}",instance="{n}",job="vtax",{labels}}} {value:g}'
                w("".join(prefix + s for s in stamps))

    def counter(name, per_node):
        # per_node yields (labels, start value, increase per second)
        w(f"# TYPE {name} counter\n")
        for n, c in nodes:
            for labels, v0, slope in per_node(n, c):
                head = f'{name}_total{{cluster="{c}",instance="{n}",job="vtax",{labels}}} '
                w("".join(f"{head}{v0 + slope * (t - a.start):.6g} {t}\n" for t in times))

    def gpus(n):
        return [f'gpu="{g}",gpu_uuid="GPU-{n}-{g}"' for g in range(a.gpus)]

    noise = {n: rng.uniform(-0.01, 0.01) for n, _ in nodes}
    gauge("vtax_gpu_sm_clock_hertz", lambda n, c: [
        (l, 1.98e9 * (0.7 if n in degraded and g == 0 else 0.98 + noise[n]))
        for g, l in enumerate(gpus(n))])
    gauge("vtax_gpu_sm_clock_max_hertz", lambda n, c: [(l, 1.98e9) for l in gpus(n)])
    gauge("vtax_gpu_utilization_ratio", lambda n, c: [(l, 0.97) for l in gpus(n)])
    gauge("vtax_gpu_hbm_bytes_per_second", lambda n, c: [
        (l, 3.35e12 * (0.6 + noise[n])) for l in gpus(n)])
    gauge("vtax_gpu_hbm_peak_bytes_per_second", lambda n, c: [(l, 3.35e12) for l in gpus(n)])
    w("# TYPE vtax_gpu_clock_event_active gauge\n")
    for n, c in nodes:
        for l in gpus(n):
            for r in REASONS:
                w("".join(f'vtax_gpu_clock_event_active{{cluster="{c}",instance="{n}",job="vtax",{l},reason="{r}"}} 0{s}'
                          for s in stamps))
    gauge("vtax_gpu_nvlink_links_up", lambda n, c: [(l, 18) for l in gpus(n)])
    gauge("vtax_gpu_nvlink_links_product", lambda n, c: [(l, 18) for l in gpus(n)])
    gauge("vtax_gpu_pcie_link_gen", lambda n, c: [(l, 5) for l in gpus(n)])
    gauge("vtax_gpu_pcie_link_gen_max", lambda n, c: [(l, 5) for l in gpus(n)])
    gauge("vtax_gpu_pcie_link_width", lambda n, c: [(l, 16) for l in gpus(n)])
    gauge("vtax_gpu_pcie_link_width_max", lambda n, c: [(l, 16) for l in gpus(n)])
    cpus = [f'cpu="{i}"' for i in range(a.cpus)]
    gauge("vtax_jitter_wakeup_p99_seconds", lambda n, c: [(l, 2e-5 * (1 + noise[n] * 10)) for l in cpus])
    gauge("vtax_jitter_unexplained_ratio", lambda n, c: [(l, 0.001) for l in cpus])
    counter("vtax_cpu_steal_seconds", lambda n, c: [(l, 100.0, 0.001) for l in cpus])
    counter("vtax_cpu_sched_run_delay_seconds", lambda n, c: [(l, 500.0, 0.02) for l in cpus])
    ports = [f'device="mlx5_{p}",port="1"' for p in range(a.ports)]
    counter("vtax_infiniband_port_xmit_wait", lambda n, c: [(l, 1e6, 1e5) for l in ports])
    for e in ("symbol_error", "rcv_errors", "link_downed"):
        counter(f"vtax_infiniband_port_{e}", lambda n, c: [(l, 0, 0) for l in ports])
    w("# EOF\n")
    out.close()


if __name__ == "__main__":
    main()
