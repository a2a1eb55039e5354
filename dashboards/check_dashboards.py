#!/usr/bin/env python3
"""Checks the Grafana dashboards in dashboards/grafana/.

Static checks (always): every JSON file parses and is dashboard JSON (title, uid,
panels, templating with a `datasource` variable of type datasource / query prometheus and
a `node` variable; a `gpu` variable on the GPU and fabric dashboards); every panel has a
non-empty description, the templated datasource ({"type": "prometheus", "uid":
"${datasource}"}) on itself and on each target, and fieldConfig.defaults.unit; on one-node
dashboards every target selects instance="$node" (an exact match: Grafana does not
escape a single-valued variable for a regex, and an IPv6 target's name is one); panel ids and
the dashboards' uids are unique; the provisioning YAML parses and points at
/usr/share/vtax/dashboards.

Live checks (with --vtax PATH): runs the agent on a copy of the bare-metal fixture tree
with eight simulated GPUs on a free port (with a [[scrape]] of the Prometheus below, for
the service-latency panel, a store byte budget, for the store panel's budget line, and
short detector windows), a real `prometheus` scraping it every second (also under two
more instance names, a peer group of three for the peer rules) with
dashboards/alerts/vtax-rules.yml loaded, and a noisy
neighbour played on the copy's cgroup files (a container whose CPU usage jumps in bursts,
a service whose CPU pressure rises with them), so that the detector opens a real event
and names its suspect. It waits for the scrapes and for that suspect, then runs every
panel's expression (variables substituted) and every query variable's label_values()
against /api/v1/query. Each must parse and return at least
one series with $gpu as All (.*); with $gpu = 0 it must parse. No target is exempt.
Both processes are killed at the end, whatever happens.

Exit status: 0 when everything passes, 1 on any failure (each listed with its dashboard,
panel and expression), 2 on a usage or setup error.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GRAFANA = os.path.join(ROOT, "dashboards", "grafana")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "baremetal-node")
RULES = os.path.join(ROOT, "dashboards", "alerts", "vtax-rules.yml")
SCENARIOS = "training,memory-bound,thermal-throttle,power-throttle,pcie-degraded,nvlink-hidden,xid,gpu-lost"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GPU_DASHBOARDS = {"vtax-gpu", "vtax-fabric"}

# Seconds of 1 s scrapes before querying: rate() over 15s needs two samples and the
# jitter rows appear when the agent's first window (10 s by default) closes.
SCRAPE_WAIT_S = 20

# The noisy neighbour, played on the fixture copy's cgroup files (the hybrid v1 layout of
# baremetal-node): the hog is a leaf container whose cpuacct.usage (nanoseconds) the
# cgroups collector reads, the victim a leaf service whose CPU pressure (unified/, `some`
# total in microseconds) it reads. Per second, quiet and in a burst:
HOG = "/docker/3df9abf61f01116639c75d725819956b13a05e6b04e94e47886de71811ab243a"
HOG_USAGE = f"sys/fs/cgroup/cpu,cpuacct{HOG}/cpuacct.usage"
HOG_CPUS = (0.02, 1.6)
VICTIM = "/system.slice/slurmd.service"
VICTIM_PRESSURE = f"sys/fs/cgroup/unified{VICTIM}/cpu.pressure"
VICTIM_STALL = (0.002, 0.35)
# Each CPU's ticks (USER_HZ) added to the fixture copy's /proc/stat per second, in its
# first five columns (user nice system idle iowait): the jitter probe's busy_ratio is
# the share of ticks not idle while it probed, so a /proc/stat that never moves leaves
# it null and its panel empty. 40% busy, the same every second, so nothing for the
# detector to find.
STAT_TICKS_PER_SECOND = (30, 0, 10, 60, 0)
# The detector judges 2 s windows, learns its baseline from 3 of them and opens an event
# after 2 abnormal ones in a row, so the first burst, after QUIET_S seconds of quiet
# (counted from the first scrape), opens one some 6 s in. Bursts of BURST_S seconds
# follow rests of REST_S, shorter than the 6 normal windows (12 s) that close an event,
# so it stays open; the rests keep quiet seconds in the 90 s over which suspects are
# ranked, however long the queries take.
DETECT_CONFIG = "[detect]\nwindow_secs = 2\nopen_windows = 2\nmin_baseline_windows = 3\n"
QUIET_S = 10
BURST_S = 12
REST_S = 4
# Seconds after SCRAPE_WAIT_S to wait for the event's suspect to reach Prometheus.
EVENT_WAIT_S = 60


def fail(msg):
    print(f"check_dashboards: {msg}", file=sys.stderr)
    sys.exit(2)


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def static_checks(dashboards):
    errors = []
    uids = {}
    for path, d in dashboards:
        name = os.path.basename(path)
        for key in ("title", "uid", "panels", "templating", "schemaVersion"):
            if key not in d:
                errors.append(f"{name}: no {key}")
        if d.get("uid") in uids:
            errors.append(f"{name}: uid {d.get('uid')} also in {uids[d.get('uid')]}")
        uids[d.get("uid")] = name
        if not isinstance(d.get("schemaVersion"), int) or d.get("schemaVersion", 0) < 36:
            errors.append(f"{name}: schemaVersion {d.get('schemaVersion')} is older than 36")
        variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
        ds = variables.get("datasource")
        if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
            errors.append(f"{name}: no datasource variable of type datasource, query prometheus")
        needed = ["node"] + (["gpu"] if d.get("uid") in GPU_DASHBOARDS else [])
        for v in needed:
            if v not in variables:
                errors.append(f"{name}: no {v} variable")
            elif variables[v].get("datasource") != DATASOURCE:
                errors.append(f"{name}: variable {v} does not use the templated datasource")
        node = variables.get("node", {}).get("query", {})
        node = node.get("query") if isinstance(node, dict) else node
        if node != "label_values(vtax_collector_success, instance)":
            errors.append(f"{name}: node variable is not label_values(vtax_collector_success, instance)")
        ids = set()
        for p in all_panels(d.get("panels", [])):
            title = p.get("title", "<untitled>")
            where = f"{name}: panel {title!r}"
            if p.get("id") in ids:
                errors.append(f"{where}: id {p.get('id')} repeated")
            ids.add(p.get("id"))
            if "gridPos" not in p:
                errors.append(f"{where}: no gridPos")
            if p.get("type") == "row":
                continue
            if not str(p.get("description", "")).strip():
                errors.append(f"{where}: no description")
            if p.get("datasource") != DATASOURCE:
                errors.append(f"{where}: datasource is {p.get('datasource')!r}, not the templated one")
            if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
                errors.append(f"{where}: no fieldConfig.defaults.unit")
            targets = p.get("targets") or []
            if not targets:
                errors.append(f"{where}: no targets")
            for t in targets:
                # a one-node dashboard must not mix in other nodes' series
                single = not variables.get("node", {}).get("multi")
                if single and "$node" not in t.get("expr", "") and "${node" not in t.get("expr", ""):
                    errors.append(f"{where}: target {t.get('refId')} does not select $node")
                # Grafana puts a single-valued variable into a regex unescaped:
                # an IPv6 target's "[fd00::1]:9433" is then a character class
                # that matches nothing.
                if single and re.search(r'=~\s*"\$\{?node\}?"', t.get("expr", "")):
                    errors.append(f"{where}: target {t.get('refId')} matches $node as a regex; use instance=\"$node\"")
                if not str(t.get("expr", "")).strip():
                    errors.append(f"{where}: target {t.get('refId')} has no expr")
                if t.get("datasource", DATASOURCE) != DATASOURCE:
                    errors.append(f"{where}: target {t.get('refId')} has another datasource")
    return errors


def provisioning_checks():
    """The provider YAML points Grafana at where the package installs the dashboards."""
    try:
        import yaml
    except ImportError:
        return ["PyYAML is not installed (apt-get install python3-yaml)"]
    errors = []
    prov = os.path.join(GRAFANA, "provisioning")
    try:
        with open(os.path.join(prov, "dashboards.yml")) as f:
            doc = yaml.safe_load(f)
        paths = [p.get("options", {}).get("path") for p in doc.get("providers", [])]
        if "/usr/share/vtax/dashboards" not in paths:
            errors.append(f"provisioning/dashboards.yml: no provider with path /usr/share/vtax/dashboards ({paths})")
        with open(os.path.join(prov, "datasource.example.yml")) as f:
            doc = yaml.safe_load(f)
        if not any(d.get("type") == "prometheus" for d in doc.get("datasources", [])):
            errors.append("provisioning/datasource.example.yml: no prometheus datasource")
    except (OSError, yaml.YAMLError, AttributeError) as e:
        errors.append(f"provisioning: {e}")
    return errors


def substitute(expr, instance, gpu):
    expr = expr.replace("$__rate_interval", "15s").replace("${__rate_interval}", "15s")
    expr = expr.replace("$__interval", "5s").replace("${__interval}", "5s")
    expr = re.sub(r"\$\{?node(:[a-z]+)?\}?", instance, expr)
    expr = re.sub(r"\$\{?gpu(:[a-z]+)?\}?", gpu, expr)
    if "$" in re.sub(r"\{\{[^}]*\}\}", "", expr):
        raise ValueError(f"unsubstituted variable in {expr!r}")
    return expr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"error": body.decode(errors="replace")}
    except (urllib.error.URLError, OSError, ValueError) as e:
        return 0, {"error": str(e)}


def query(prom, expr):
    status, body = http_json(f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    if status != 200 or body.get("status") != "success":
        return f"query failed (HTTP {status}): {body.get('error', body)}"
    if not body["data"]["result"]:
        return "no series"
    return None


def label_values(prom, expr):
    """label_values(metric, label): the values, as Grafana would list them."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", expr)
    if not m:
        return None, f"not a label_values(metric, label) query: {expr!r}"
    metric, label = m.groups()
    url = f"http://{prom}/api/v1/series?" + urllib.parse.urlencode({"match[]": metric})
    status, body = http_json(url)
    if status != 200 or body.get("status") != "success":
        return None, f"series query failed (HTTP {status}): {body.get('error', body)}"
    values = sorted({s[label] for s in body["data"] if label in s})
    return values, None if values else "no values"


def stop(proc):
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Neighbour(threading.Thread):
    """Advances the hog's CPU usage, the victim's CPU pressure and every CPU's ticks in
    /proc/stat in a fixture copy once a second, from `start()` until `stop()`. Files are
    rewritten in place: the agent keeps them open and re-reads them at offset 0, so a new
    file (a rename) would read to it as a removed cgroup. Their text only grows (counters
    rise), so a read never finds it cut short."""

    def __init__(self, root):
        super().__init__(name="neighbour", daemon=True)
        self.usage_path = os.path.join(root, HOG_USAGE)
        self.pressure_path = os.path.join(root, VICTIM_PRESSURE)
        self.stat_path = os.path.join(root, "proc", "stat")
        with open(self.stat_path) as f:
            self.stat = f.read()
        self.cpus = len(re.findall(r"^cpu\d+ ", self.stat, re.M))
        with open(self.usage_path) as f:
            self.usage_ns = int(f.read())
        with open(self.pressure_path) as f:
            self.pressure = f.read()
        m = re.search(r"^some .*total=(\d+)$", self.pressure, re.M)
        if not m:
            fail(f"{self.pressure_path}: no some total=")
        self.stall_us = int(m.group(1))
        self.done = threading.Event()
        self.error = None

    def stop(self):
        self.done.set()
        if self.is_alive():
            self.join(timeout=5)

    @staticmethod
    def rewrite(path, text):
        data = text.encode()
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def advance_ticks(self, m):
        """One second more of a /proc/stat CPU line's first five columns; the all-CPU
        line (`cpu`) adds every CPU's."""
        per_line = self.cpus if m.group(1).strip() == "cpu" else 1
        ticks = [int(t) + per_line * add
                 for t, add in zip(m.group(2).split(), STAT_TICKS_PER_SECOND)]
        return m.group(1) + " ".join(str(t) for t in ticks)

    def run(self):
        started = time.time()
        try:
            while True:
                # Write at half past: the collectors read just after whole seconds, so
                # each read sees exactly one more second.
                if self.done.wait((0.5 - time.time() % 1.0) % 1.0 or 1.0):
                    return
                t = time.time() - started
                burst = int(t >= QUIET_S and (t - QUIET_S) % (BURST_S + REST_S) < BURST_S)
                self.usage_ns += int(HOG_CPUS[burst] * 1e9)
                self.stall_us += int(VICTIM_STALL[burst] * 1e6)
                self.rewrite(self.usage_path, f"{self.usage_ns}\n")
                self.pressure = re.sub(r"^(some .*total=)\d+$", rf"\g<1>{self.stall_us}",
                                       self.pressure, count=1, flags=re.M)
                self.rewrite(self.pressure_path, self.pressure)
                self.stat = re.sub(r"^(cpu\d* +)(\d+(?: \d+){4})", self.advance_ticks,
                                   self.stat, flags=re.M)
                self.rewrite(self.stat_path, self.stat)
        except OSError as e:
            self.error = str(e)


def live_checks(dashboards, vtax, keep_going):
    prometheus = shutil.which("prometheus")
    if not prometheus:
        fail("prometheus is not installed (apt-get install prometheus)")
    tmp = tempfile.mkdtemp(prefix="vtax-dashboards-")
    agent = prom = neighbour = None
    failures = []
    checked = 0
    try:
        # A copy, since the neighbour below writes to it.
        fixture = os.path.join(tmp, "fixture")
        shutil.copytree(FIXTURE, fixture, symlinks=True)
        neighbour = Neighbour(fixture)
        agent_port = free_port()
        prom_port = free_port()
        # The service-latency panel needs a [[scrape]] target with a histogram:
        # this Prometheus's own request latency, which the agent's scrapes of it
        # feed every second. The store panel's budget line needs a byte budget
        # (without one the agent exports none); 1 GiB is never reached here.
        # The detector's windows are short enough for the neighbour to open an
        # event within the wait.
        agent_config = os.path.join(tmp, "vtax.toml")
        with open(agent_config, "w") as f:
            f.write("[store]\nretention_max_bytes = 1073741824\n\n" + DETECT_CONFIG + "\n"
                    "[[scrape]]\nname = \"prometheus\"\n"
                    f"url = \"http://127.0.0.1:{prom_port}/metrics\"\n"
                    "interval_secs = 1\ntimeout_secs = 0.8\n"
                    "histograms = [\"prometheus_http_request_duration_seconds\"]\n")
        agent_log = open(os.path.join(tmp, "agent.log"), "w")
        agent = subprocess.Popen(
            [vtax, "run", "--config", agent_config, "--data-dir", os.path.join(tmp, "data"),
             "--web.listen-address", f"127.0.0.1:{agent_port}",
             "--path.procfs", os.path.join(fixture, "proc"),
             "--path.sysfs", os.path.join(fixture, "sys"),
             "--simulate-gpus", "8", "--simulate-gpu-scenarios", SCENARIOS],
            stdout=agent_log, stderr=subprocess.STDOUT, cwd=tmp)
        # The alert rules are loaded for the panels built on their recording rules,
        # and the agent is scraped under two more instance names too: the peer
        # rules compare a node only in a group of at least three.
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    f"rule_files:\n  - {RULES}\n"
                    "scrape_configs:\n  - job_name: vtax\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{agent_port}']\n"
                    + "".join(f"      - targets: ['127.0.0.1:{agent_port}']\n"
                              f"        labels: {{instance: peer-{i}}}\n" for i in (1, 2)))
        prom_log = open(os.path.join(tmp, "prometheus.log"), "w")
        prom = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=prom_log, stderr=subprocess.STDOUT, cwd=tmp)
        addr = f"127.0.0.1:{prom_port}"
        instance = f"127.0.0.1:{agent_port}"

        # Wait for the first successful scrape, then for SCRAPE_WAIT_S seconds of them
        # (rate() over 15s needs two samples; the jitter rows need a closed window).
        deadline = time.time() + 60
        while True:
            for p, what in ((agent, "agent"), (prom, "prometheus")):
                if p.poll() is not None:
                    log = os.path.join(tmp, f"{what}.log")
                    fail(f"{what} exited with {p.returncode}; its log:\n" + open(log).read()[-4000:])
            if query(addr, f'up{{job="vtax",instance="{instance}"}} == 1') is None:
                break
            if time.time() > deadline:
                fail("prometheus did not scrape the agent within 60 s")
            time.sleep(0.5)
        neighbour.start()
        print(f"check_dashboards: agent on {instance}, prometheus on {addr}; waiting {SCRAPE_WAIT_S} s of scrapes "
              f"and a neighbour event", flush=True)
        time.sleep(SCRAPE_WAIT_S)
        suspect = (f'vtax_neighbor_suspected{{instance="{instance}",resource="cpu",'
                   f'victim="{VICTIM}",suspect="{HOG}"}}')
        deadline = time.time() + EVENT_WAIT_S
        while query(addr, suspect) is not None and neighbour.error is None:
            if time.time() > deadline:
                with open(os.path.join(tmp, "agent.log")) as f:
                    events = [line for line in f if "Noisy-neighbour" in line]
                failures.append(("vtax-neighbours", "the neighbour event", suspect,
                                 f"no event named the hog within {SCRAPE_WAIT_S + EVENT_WAIT_S} s; "
                                 f"the agent's last event lines: {events[-5:]}"))
                break
            time.sleep(0.5)
        if neighbour.error:
            failures.append(("vtax-neighbours", "the neighbour event", suspect,
                             f"the neighbour stopped: {neighbour.error}"))

        for path, d in dashboards:
            uid = d.get("uid")
            for v in d.get("templating", {}).get("list", []):
                if v.get("type") != "query":
                    continue
                q = v.get("query")
                q = q.get("query") if isinstance(q, dict) else q
                values, err = label_values(addr, substitute(q, instance, ".*"))
                checked += 1
                if err:
                    failures.append((uid, f"variable {v['name']}", q, err))
                elif v["name"] == "node" and instance not in values:
                    failures.append((uid, "variable node", q, f"{instance} not among {values}"))
            for p in all_panels(d.get("panels", [])):
                if p.get("type") == "row":
                    continue
                title = p.get("title")
                for t in p.get("targets", []):
                    # $gpu as All (.*) must return data; as one GPU ("0", a healthy training
                    # GPU) it must parse, though an event panel may rightly show nothing
                    for gpu in ((".*", "0") if "$gpu" in t["expr"] else (".*",)):
                        expr = substitute(t["expr"], instance, gpu)
                        err = query(addr, expr)
                        checked += 1
                        if err == "no series" and gpu != ".*":
                            continue
                        if err:
                            failures.append((uid, title, expr, err))
    finally:
        if neighbour:
            neighbour.stop()
        stop(prom)
        stop(agent)
        if keep_going:
            print(f"check_dashboards: logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return checked, failures


def main():
    # a SIGTERM (a CI timeout) unwinds through the finally that stops both children
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vtax", help="agent binary: also run every query against a real Prometheus scraping it")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, TSDB)")
    args = ap.parse_args()

    dashboards = []
    errors = []
    files = sorted(f for f in os.listdir(GRAFANA) if f.endswith(".json"))
    if not files:
        fail(f"no dashboards in {GRAFANA}")
    for f in files:
        path = os.path.join(GRAFANA, f)
        try:
            with open(path) as fh:
                dashboards.append((path, json.load(fh)))
        except ValueError as e:
            errors.append(f"{f}: not JSON: {e}")
    errors += static_checks(dashboards)
    errors += provisioning_checks()
    panels = sum(1 for _, d in dashboards for p in all_panels(d.get("panels", [])) if p.get("type") != "row")
    for e in errors:
        print(f"FAIL {e}")
    print(f"check_dashboards: {len(files)} dashboards, {panels} panels, {len(errors)} static problems")

    live_failures = []
    if args.vtax:
        if not os.access(args.vtax, os.X_OK):
            fail(f"{args.vtax} is not an executable")
        checked, live_failures = live_checks(dashboards, os.path.abspath(args.vtax), args.keep)
        for uid, title, expr, err in live_failures:
            print(f"FAIL {uid}: {title!r}: {err}\n     {expr}")
        print(f"check_dashboards: {checked} queries against Prometheus, {len(live_failures)} failing")
    if errors or live_failures:
        sys.exit(1)
    print("check_dashboards: OK")


if __name__ == "__main__":
    main()
