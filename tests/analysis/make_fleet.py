"""Generates a small multi-node vtax store for the analysis recipes and the report.

usage: make_fleet.py VTAX_BINARY OUT_DIR [SECONDS]

Runs one `vtax run` per node at the same time, each on a fixture tree with four
simulated H100s and its own `--store.node`, stops them with SIGTERM (a clean stop
publishes every row and leaves no WAL and no replaced file), and lays the stores
out as the uploader does:

  OUT_DIR/nodes/<node>/tables/<table>/date=YYYY-MM-DD/<file>.parquet   (each node's own store)
  OUT_DIR/fleet/tables/<table>/node=<node>/date=YYYY-MM-DD/<file>.parquet
  OUT_DIR/leftover/...   node_a's store run once more for 3 s, merged, and the
                         merge's inputs put back beside the merged file (what a
                         kill between merge and clean-up, or a copy taken then,
                         leaves)

NODES below says what each node plays; the recipes' assertions rely on it.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")

# node name -> (fixture tree, scenario of its four GPUs). node_c is the straggler:
# its GPUs are held down by temperature and power, so its utilisation and HBM
# bandwidth trail the others'.
NODES = {
    "node_a": ("baremetal-node", "training"),
    "node_b": ("vm-node", "training"),
    "node_c": ("vm-node", "thermal-throttle,power-throttle"),
}
GPUS_PER_NODE = 4

# Short jitter windows so a short run still has several windows per CPU.
CONFIG = """
[collectors.jitter]
window_secs = 2
rotate_ms = 500

# Short detector windows: node_c's throttled GPUs open events within a short run.
[detect]
window_secs = 2
"""


def run_agents(vtax, config, out, stores, seconds):
    """Runs one agent per node into its store for `seconds`, then stops them cleanly."""
    agents = []
    for node, data in stores.items():
        fixture, scenarios = NODES[node]
        tree = os.path.join(FIXTURES, fixture)
        log = open(os.path.join(out, f"{node}.log"), "a")
        agents.append((node, log, subprocess.Popen(
            [vtax, "run", "--config", config, "--data-dir", data, "--store.node", node,
             "--web.listen-address", "127.0.0.1:0",
             "--path.procfs", os.path.join(tree, "proc"), "--path.sysfs", os.path.join(tree, "sys"),
             "--simulate-gpus", str(GPUS_PER_NODE), "--simulate-gpu-scenarios", scenarios],
            stdout=log, stderr=log)))
    time.sleep(seconds)
    for node, log, agent in agents:
        agent.send_signal(signal.SIGTERM)
    for node, log, agent in agents:
        code = agent.wait(timeout=60)
        log.close()
        if code != 0:
            sys.exit(f"make_fleet: the agent for {node} exited with {code}; see {out}/{node}.log")


def main():
    vtax, out = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    config = os.path.join(out, "vtax.toml")
    with open(config, "w") as f:
        f.write(CONFIG)
    run_agents(vtax, config, out, {node: os.path.join(out, "nodes", node) for node in NODES}, seconds)
    for node in NODES:
        tables = os.path.join(out, "nodes", node, "tables")
        for table in sorted(os.listdir(tables)):
            for part in sorted(os.listdir(os.path.join(tables, table))):
                src = os.path.join(tables, table, part)
                dst = os.path.join(out, "fleet", "tables", table, f"node={node}", part)
                os.makedirs(dst, exist_ok=True)
                for name in os.listdir(src):
                    if name.endswith(".parquet"):
                        shutil.copy2(os.path.join(src, name), dst)
    make_leftover(vtax, config, os.path.join(out, "nodes", "node_a"), out)
    print(f"make_fleet: {len(NODES)} nodes, {seconds:g} s each, in {out}")


def make_leftover(vtax, config, store, out):
    """node_a's store, run a second time (a second file per table), merged,
    and the merge's inputs put back beside the merged file."""
    leftover = os.path.join(out, "leftover")
    shutil.copytree(store, leftover)
    run_agents(vtax, config, out, {"node_a": leftover}, 3)
    inputs = {}
    for root, _, names in os.walk(os.path.join(leftover, "tables")):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                inputs[os.path.join(root, name)] = f.read()
    # An hour into tomorrow: today is then over by more than the store's
    # publish grace, whatever the hour now (at midnight sharp, a run during
    # the day's last hour merged nothing).
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).strftime("%Y-%m-%dT01:00:00Z")
    subprocess.run([vtax, "compact", "--data-dir", leftover, "--now", tomorrow],
                   check=True, capture_output=True)
    for path, data in inputs.items():
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
