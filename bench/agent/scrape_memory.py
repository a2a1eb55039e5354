#!/usr/bin/env python3
"""Resident memory of the agent while it scrapes one large local target.

Serves an exposition of SERIES series (`huge{i="0"} 0`, ...; 1M series is a 20.8 MB
body) on 127.0.0.1, runs `vtax run` with one [[scrape]] target pointed at it (every
other collector as configured by default, jitter off), samples VmRSS and VmHWM from
/proc/<pid>/status every 0.5 s for SECONDS, then stops the agent and prints one line:
the largest and last resident size, the peak (VmHWM), the bytes of the data directory
(the WAL and parts the scrapes wrote), whether the agent was still alive, and what
/metrics said about the target.

    python3 bench/agent/scrape_memory.py --vtax target/debug/vtax --series 1000000 --seconds 30
    python3 bench/agent/scrape_memory.py --store-extra 'wal_max_backlog_bytes = 33554432' \
        --target-extra 'body_size_limit_bytes = 67108864' ...
"""
import argparse
import http.server
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request


def kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def tree_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtax", default="target/debug/vtax")
    ap.add_argument("--series", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval-secs", type=float, default=2.0)
    ap.add_argument("--target-extra", default="", help="more keys for the [[scrape]] table")
    ap.add_argument("--store-extra", default="", help="keys for the [store] table")
    args = ap.parse_args()

    body = "".join(f'huge{{i="{i}"}} {i}\n' for i in range(args.series)).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass  # the agent hung up: a scrape past its limit

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

    work = tempfile.mkdtemp(prefix="vtax-scrape-memory-")
    data = os.path.join(work, "data")
    port = free_port()
    config = os.path.join(work, "vtax.toml")
    with open(config, "w") as f:
        f.write(
            f'[web]\nlisten_address = "127.0.0.1:{port}"\n\n[store]\n{args.store_extra}\n\n'
            f'[[scrape]]\nname = "huge"\nurl = "{url}"\n'
            f"interval_secs = {args.interval_secs}\ntimeout_secs = {args.interval_secs * 0.9}\n"
            f"{args.target_extra}\n"
        )
    log = open(os.path.join(work, "log"), "w")
    agent = subprocess.Popen(
        [args.vtax, "run", "--config", config, "--data-dir", data, "--no-collector.jitter"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    rss_max = hwm = rss_last = 0
    alive = True
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        if agent.poll() is not None:
            alive = False
            break
        try:
            rss_last = kib(agent.pid, "VmRSS:")
            hwm = max(hwm, kib(agent.pid, "VmHWM:"))
        except OSError:
            alive = False
            break
        rss_max = max(rss_max, rss_last)
        time.sleep(0.5)
    target = ""
    if alive:
        try:
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            picked = [
                f"{m.group(1)}={m.group(2)}"
                for m in re.finditer(r'^vtax_scrape_target_(\w+)\{target="huge"\} (\S+)$', metrics, re.M)
            ]
            target = " ".join(picked)
        except OSError as e:
            target = f"/metrics failed: {e}"
    data_bytes = tree_bytes(data)
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
    server.shutdown()
    print(
        f"series={args.series} body_bytes={len(body)} seconds={args.seconds:.0f} "
        f"rss_mib_max={rss_max / 1024:.1f} rss_mib_last={rss_last / 1024:.1f} "
        f"peak_rss_mib={hwm / 1024:.1f} data_mib={data_bytes / 2**20:.1f} "
        f"alive={'yes' if alive else 'no'}"
    )
    print(f"target: {target}")
    if not alive:
        with open(os.path.join(work, "log")) as f:
            print("log tail:", f.read()[-2000:])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
