#!/usr/bin/env python3
"""Writes agent/hot-text.txt: the functions the agent runs, for build.rs to pack.

The release build puts the functions listed in agent/hot-text.txt into one stretch
of the binary (agent/src/hot_text.rs says why). This profiles the agent to find them:

1. Under callgrind, which names every function executed: the agent on defaults
   (no config), scraped once a second as plain text, gzip and OpenMetrics; and the
   bar's configuration with a seeded day merging (day_merge_peak.py).
2. Natively, under `perf record -e page-faults`: the same two runs against a build
   with the list, taking every function whose first touch faulted outside the
   packed stretch. Valgrind's CPU has no AVX-512, so code chosen by CPU feature at
   run time (crc32fast, zstd) only shows here. Repeated --native-rounds times.

Functions are listed hottest first, with every other name at the same address
(LLVM aliases functions with identical bodies, and a section carries one name).

    sudo bench/agent/hot_text_profile.py [--default-secs 90] [--native-rounds 2]

Needs root (cgroups), valgrind, perf, and a seeded day (see day_merge_peak.py).
About 12 minutes on 2 vCPUs; rerun it when the code the agent runs has changed a lot.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_vs_node_exporter as bench  # noqa: E402
import resident_code  # noqa: E402

REPO = bench.REPO
LIST = os.path.join(REPO, "agent", "hot-text.txt")
BINARY = os.path.join(REPO, "target", "release", "vtax")
DAY_MERGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "day_merge_peak.py")
HEADER = """\
# The functions the agent runs, hottest first: build.rs packs them into one
# stretch of the release binary (agent/src/hot_text.rs). Written by
# bench/agent/hot_text_profile.py; rerun it when the code the agent runs changes.
"""


def build():
    """A copy of a fresh release build, so the next build cannot replace it mid-run."""
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "vtax"], cwd=REPO, check=True)
    fd, copy = tempfile.mkstemp(prefix="vtax-hot-text-")
    os.close(fd)
    shutil.copy(BINARY, copy)
    return copy


def symbols(binary):
    """Function symbols: {name: address} and {address: [names]}."""
    out = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True,
                         check=True).stdout
    address_of, names_at = {}, {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] in "tTwW":
            address = int(fields[0], 16)
            address_of[fields[2]] = address
            names_at.setdefault(address, []).append(fields[2])
    return address_of, names_at


def text_range(binary):
    """Where the ordinary (unpacked) `.text` lies."""
    for name, start, size in resident_code.sections(binary):
        if name == ".text":
            return start, start + size
    sys.exit(f"{binary} has no .text section")


def run_default(binary, seconds, wrap):
    """The agent on defaults, scraped once a second in each format."""
    work = tempfile.mkdtemp(prefix="vtax-hot-text-")
    port = bench.free_port()
    agent = subprocess.Popen(
        wrap + [binary, "run", "--data-dir", os.path.join(work, "data"),
                "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "vtax.log"), "w"))
    formats = [{"Accept-Encoding": "gzip"}, {"Accept": "application/openmetrics-text"}, {}]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for headers in formats:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                                 headers=headers)
                urllib.request.urlopen(request, timeout=10).read()
            except OSError:
                pass  # not listening yet
        time.sleep(1)
    agent.send_signal(signal.SIGINT)
    agent.wait(timeout=120)
    shutil.rmtree(work)


def run_day_merge(binary, wrap):
    subprocess.run([sys.executable, DAY_MERGE, "--vtax", binary, "--compact-secs", "60",
                    "--after-secs", "20", "--wrap", " ".join(wrap)],
                   check=True, stdout=subprocess.DEVNULL)


def callgrind_costs(path, binary_name):
    """{function: instructions} for the binary's functions in a callgrind file."""
    names, objects, costs = {}, {}, {}
    current_object = current = None
    spec = re.compile(r"^(ob|fn|cfn|cob)=\((\d+)\)(?: (.*))?$")
    with open(path, errors="replace") as f:
        for line in f:
            match = spec.match(line.rstrip("\n"))
            if match:
                kind, key, name = match.groups()
                table = objects if kind in ("ob", "cob") else names
                if name is not None:
                    table[key] = name
                if kind == "ob":
                    current_object = objects[key]
                elif kind == "fn":
                    current = None
                    if current_object and os.path.basename(current_object) == binary_name:
                        current = re.sub(r"'\d+$", "", names[key])  # recursion depth
                        costs.setdefault(current, 0)
                continue
            if current and line[:1].isdigit():
                fields = line.split()
                if len(fields) >= 2 and fields[1].isdigit():
                    costs[current] += int(fields[1])
    return costs


def cold_faults(perf_data, binary, address_of, hot):
    """Functions in the binary outside the packed stretch whose code faulted."""
    out = subprocess.run(["perf", "script", "--no-demangle", "-i", perf_data,
                          "-F", "ip,sym,dso,addr"], capture_output=True, text=True).stdout
    text = text_range(binary)
    line_spec = re.compile(r"^\s*(\w+) .*? \((.*?)\)\s+(\w+) (.*?) \((.*?)\)$")
    found = set()
    for line in out.splitlines():
        match = line_spec.match(line.rstrip())
        if not match:
            continue
        address, _, ip, symbol, dso = match.groups()
        if address != ip or os.path.basename(dso) != os.path.basename(binary):
            continue  # a data fault, or another object's code
        name = re.sub(r"\+0x[0-9a-f]+$", "", symbol)
        at = address_of.get(name)
        if at is not None and text[0] <= at < text[1] and name not in hot:
            found.add(name)
    return found


def with_aliases(ordered, table, seen=()):
    """`ordered` with every other name at each one's address, leaving out `seen`."""
    address_of, names_at = table
    listed, seen = [], set(seen)
    for name in ordered:
        for alias in names_at.get(address_of.get(name), [name]):
            if alias not in seen:
                seen.add(alias)
                listed.append(alias)
    return listed


def write_list(names):
    # Callgrind also names code it has no symbol for ("(below main)", "0x...").
    symbol = re.compile(r"^[A-Za-z_][A-Za-z0-9_$.]*$")
    with open(LIST, "w") as f:
        f.write(HEADER)
        for name in names:
            if symbol.match(name):
                f.write(name + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--default-secs", type=int, default=90)
    parser.add_argument("--native-rounds", type=int, default=2)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="vtax-hot-text-profile-")
    # Valgrind reads function symbols from .text only: profile the plain layout.
    write_list([])
    binary = build()
    name = os.path.basename(binary)
    outs = [os.path.join(work, f"callgrind.{label}") for label in ("default", "day")]
    runs = [
        threading.Thread(target=run_default, args=(binary, args.default_secs, [
            "valgrind", "--tool=callgrind", "--demangle=no", f"--callgrind-out-file={outs[0]}"])),
        threading.Thread(target=run_day_merge, args=(binary, [
            "valgrind", "--tool=callgrind", "--demangle=no", f"--callgrind-out-file={outs[1]}"])),
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    costs = {}
    for out in outs:
        for function, cost in callgrind_costs(out, name).items():
            costs[function] = costs.get(function, 0) + cost
    ordered = [f for f, _ in sorted(costs.items(), key=lambda kv: -kv[1])]
    hot = with_aliases(ordered, symbols(binary))
    print(f"callgrind: {len(costs)} functions executed, {len(hot)} names with aliases")
    os.unlink(binary)
    for round_number in range(args.native_rounds):
        write_list(hot)
        binary = build()
        faults = os.path.join(work, f"faults.{round_number}")
        wrap = ["perf", "record", "-q", "-e", "page-faults", "-c", "1", "-d", "-o"]
        run_default(binary, 20, wrap + [faults + ".default", "--"])
        run_day_merge(binary, wrap + [faults + ".day", "--"])
        table, listed = symbols(binary), set(hot)
        cold = set()
        for data in (faults + ".default", faults + ".day"):
            cold |= cold_faults(data, binary, table[0], listed)
        hot += with_aliases(sorted(cold), table, seen=listed)
        print(f"native round {round_number + 1}: {len(cold)} functions faulted outside")
        os.unlink(binary)
        if not cold:
            break
    write_list(hot)
    shutil.rmtree(work)
    print(f"wrote {len(hot)} functions to {LIST}")


if __name__ == "__main__":
    main()
