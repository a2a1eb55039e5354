"""Generates a small multi-node vtax store for the analysis recipes and the report.

usage: make_fleet.py VTAX_BINARY OUT_DIR [SECONDS]

Runs one `vtax run` per node at the same time, each on a fixture tree with four
simulated H100s and its own `--store.node`, stops them with SIGTERM (a clean stop
publishes every row and leaves no WAL and no replaced file), and lays the stores
out as the uploader does:

  OUT_DIR/nodes/<node>/tables/<table>/date=YYYY-MM-DD/<file>.parquet   (each node's own store)
  OUT_DIR/fleet/tables/<table>/node=<node>/date=YYYY-MM-DD/<file>.parquet
  OUT_DIR/leftover/...   node_a's store run once more for 3 s, merged, and the
                         merge's inputs put back beside the merged file: what an
                         older vtax, which published a merged file before it
                         deleted the inputs, left after a kill between the two
  OUT_DIR/interrupted/<state>/...
                         the same merge stopped at each of its steps (see
                         INTERRUPTED), as a kill there leaves the store; with
                         interrupted.json saying what each holds

NODES below says what each node plays; the recipes' assertions rely on it.
REBOOTED nodes run a second time, for 3 s, on a copy of their tree whose
counters are a thousandth of the first's, with their GPUs idle: a reboot in
the middle of the fleet's hour, the job not yet started again, as their
stores record it.
"""
import json
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

# Nodes that reboot after their first run, and the counters that show it:
# node_b's CPU times (steal among them), node_a's InfiniBand port counters.
# A query that takes a counter's growth over the hour as its largest value
# less its smallest reads the boot before as steal or congestion, and one
# that averages the GPUs' bandwidth or clocks over idle seconds too takes
# the idle GPUs for slow ones: either names a rebooted node where node_c
# holds the job back.
REBOOTED = ["node_a", "node_b"]

# Short jitter windows so a short run still has several windows per CPU.
CONFIG = """
[collectors.jitter]
window_secs = 2
rotate_ms = 500

# Short detector windows: node_c's throttled GPUs open events within a short run.
[detect]
window_secs = 2
"""


def rebooted_tree(fixture, out):
    """A copy of a fixture tree as the node reads just after a reboot: every
    /proc/stat CPU time and every InfiniBand port counter a thousandth of
    what the tree holds. Returns its path."""
    tree = os.path.join(out, f"rebooted-{fixture}")
    shutil.copytree(os.path.join(FIXTURES, fixture), tree, symlinks=True)
    stat = os.path.join(tree, "proc", "stat")
    with open(stat) as f:
        lines = f.read().splitlines()
    with open(stat, "w") as f:
        for line in lines:
            name, *fields = line.split()
            if name.startswith("cpu"):
                line = " ".join([name] + [str(int(v) // 1000) for v in fields])
            f.write(line + "\n")
    for root, _, names in os.walk(os.path.join(tree, "sys")):
        if os.path.basename(root) not in ("counters", "hw_counters"):
            continue
        for name in names:
            path = os.path.join(root, name)
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit():
                with open(path, "w") as f:
                    f.write(f"{int(text) // 1000}\n")
    return tree


def run_agents(vtax, config, out, stores, seconds, trees=None, scenarios=None):
    """Runs one agent per node into its store for `seconds`, then stops them
    cleanly. `trees` and `scenarios` give a node a tree and GPU scenarios
    other than NODES gives it."""
    agents = []
    for node, data in stores.items():
        fixture, node_scenarios = NODES[node]
        tree = (trees or {}).get(node) or os.path.join(FIXTURES, fixture)
        node_scenarios = (scenarios or {}).get(node, node_scenarios)
        log = open(os.path.join(out, f"{node}.log"), "a")
        agents.append((node, log, subprocess.Popen(
            [vtax, "run", "--config", config, "--data-dir", data, "--store.node", node,
             "--web.listen-address", "127.0.0.1:0",
             "--path.procfs", os.path.join(tree, "proc"), "--path.sysfs", os.path.join(tree, "sys"),
             "--simulate-gpus", str(GPUS_PER_NODE), "--simulate-gpu-scenarios", node_scenarios],
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
    run_agents(vtax, config, out, {node: os.path.join(out, "nodes", node) for node in REBOOTED}, 3,
               trees={node: rebooted_tree(NODES[node][0], out) for node in REBOOTED},
               scenarios={node: "idle" for node in REBOOTED})
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
    inputs, merged = make_leftover(vtax, config, os.path.join(out, "nodes", "node_a"), out)
    make_interrupted(vtax, out, inputs, merged)
    print(f"make_fleet: {len(NODES)} nodes, {seconds:g} s each, in {out}")


def make_leftover(vtax, config, store, out):
    """node_a's store, run a second time (a second file per table), merged,
    and the merge's inputs put back beside the merged file. Returns the
    inputs (path -> bytes) and the merged files' paths."""
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
    merged = [os.path.join(root, name)
              for root, _, names in os.walk(os.path.join(leftover, "tables"))
              for name in names if os.path.join(root, name) not in inputs]
    inputs = {path: data for path, data in inputs.items() if not os.path.exists(path)}
    for path, data in inputs.items():
        with open(path, "wb") as f:
            f.write(data)
    return inputs, merged


# What a kill at each step of a merge leaves (the store's `Store::finish_merge`):
# the merged file is written as `.<name>.pending`, the inputs are deleted, then
# it is renamed to `<name>`. Each state: which of the inputs are still there
# ("all", "some": the first half, at least one gone, or "none"), and whether
# the merged file has its published name yet.
INTERRUPTED = {
    "pending_beside_every_input": ("all", False),
    "pending_beside_some_inputs": ("some", False),
    "pending_alone": ("none", False),
    "published": ("none", True),
}


def make_interrupted(vtax, out, inputs, merged):
    """The merge of `inputs` into `merged` (from make_leftover) stopped at each
    of its steps, one store per step under OUT_DIR/interrupted/, and
    interrupted.json: per state, the merge's inputs deleted, and whether the
    merged file has its published name."""
    leftover = os.path.join(out, "leftover")
    root = os.path.join(out, "interrupted")
    states = {}
    for state, (kept, published) in INTERRUPTED.items():
        store = os.path.join(root, state)
        shutil.copytree(leftover, store)
        relative = lambda path: os.path.relpath(path, leftover)
        keep = []
        for partition in sorted({os.path.dirname(p) for p in inputs}):
            # A merge deletes its inputs one by one: any of them may be gone.
            ordered = sorted(p for p in inputs if os.path.dirname(p) == partition)
            keep += {"all": ordered, "some": ordered[:len(ordered) // 2], "none": []}[kept]
        ordered = sorted(inputs)
        for path in ordered:
            if path not in keep:
                os.remove(os.path.join(store, relative(path)))
        if not published:
            for path in merged:
                name = os.path.join(store, relative(path))
                os.rename(name, os.path.join(os.path.dirname(name), f".{os.path.basename(name)}.pending"))
        states[state] = {"deleted_inputs": [relative(p) for p in ordered if p not in keep],
                         "published": published}
    with open(os.path.join(root, "interrupted.json"), "w") as f:
        json.dump({"vtax": os.path.abspath(vtax), "states": states}, f, indent=1)


if __name__ == "__main__":
    main()
