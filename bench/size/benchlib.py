#!/usr/bin/env python3
"""Helpers for run.sh (standard library only).

  benchlib.py stats IN.om                  -> JSON: samples, series, families, min/max ts (ms)
  benchlib.py om2prom IN.om OUT.prom       -> Prometheus text, timestamps in ms (for VictoriaMetrics)
  benchlib.py free-port                    -> a free TCP port on 127.0.0.1
  benchlib.py wait-http URL SECONDS        -> exit 0 once URL answers 200
  benchlib.py vm-metric URL NAME...        -> sum of each named metric on URL/metrics, JSON
  benchlib.py vm-settle URL [MAXSEC]       -> wait until no merges / force merges / pending rows
  benchlib.py vm-count URL START_MS END_MS -> JSON: samples, series counted from /api/v1/export
  benchlib.py vm-count-query URL START_MS END_MS -> JSON: samples and series via count_over_time queries
  benchlib.py vm-compare URL IN.om START_MS END_MS -> JSON: input values VictoriaMetrics returns changed
  benchlib.py prom-meta DIR                -> JSON: samples, series, chunks, blocks from meta.json
  benchlib.py months START_MS END_MS       -> VictoriaMetrics partition names (YYYY_MM), one a line
  benchlib.py report RESULTS.jsonl         -> markdown table
  benchlib.py record RESULTS.jsonl k=v...  -> append one result line
  benchlib.py get KEY < JSON               -> one field of a JSON object
"""

import csv
import datetime
import decimal
import glob
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request


def om_ts_to_ms(tok):
    """OpenMetrics timestamp (seconds, maybe fractional) -> integer milliseconds, exactly."""
    i = tok.find(".")
    if i >= 0 and len(tok) - i - 1 == 3 and "e" not in tok and "E" not in tok:
        return int(tok[:i] + tok[i + 1:]) if tok[:i] not in ("", "-") else int(decimal.Decimal(tok) * 1000)
    return int((decimal.Decimal(tok) * 1000).to_integral_value(decimal.ROUND_HALF_EVEN))


def _series_end(line):
    """Index just past the series part (name plus optional {labels}), scanning quotes."""
    i, n = 0, len(line)
    while i < n and line[i] not in "{ \t":
        i += 1
    if i >= n or line[i] != "{":
        return i
    j, inq = i + 1, False
    while j < n:
        c = line[j]
        if inq:
            if c == "\\":
                j += 2
                continue
            if c == '"':
                inq = False
        elif c == '"':
            inq = True
        elif c == "}":
            return j + 1
        j += 1
    raise ValueError("unterminated label set: %r" % line[:200])


def split_om_sample(line):
    """-> (series_text, value, ts_token or None). Drops an exemplar (` # {...} ...`)."""
    if " # " in line:                      # slow path: exemplar, or '#' inside a label value
        end = _series_end(line)
        rest = line[end:]
        ex = rest.find(" # ")
        if ex >= 0:
            rest = rest[:ex]
    else:
        close = line.rfind("}")
        end = close + 1 if close >= 0 else _series_end(line)
        rest = line[end:]
    parts = rest.split()
    return line[:end], parts[0], (parts[1] if len(parts) > 1 else None)


def cmd_stats(path):
    samples = 0
    series = set()
    families = 0
    lo, hi = None, None
    no_ts = 0
    with open(path, "r", encoding="utf-8", newline="\n") as f:
        for line in f:
            if line.startswith("#"):
                if line.startswith("# TYPE "):
                    families += 1
                continue
            if not line.strip():
                continue
            s, _v, ts = split_om_sample(line.rstrip("\n"))
            samples += 1
            series.add(s)
            if ts is None:
                no_ts += 1
                continue
            ms = om_ts_to_ms(ts)
            if lo is None or ms < lo:
                lo = ms
            if hi is None or ms > hi:
                hi = ms
    print(json.dumps({"samples": samples, "series": len(series), "families": families,
                      "min_ts_ms": lo, "max_ts_ms": hi, "samples_without_ts": no_ts,
                      "bytes": os.path.getsize(path)}))


def cmd_om2prom(src, dst):
    n = 0
    with open(src, "r", encoding="utf-8", newline="\n") as f, \
            open(dst, "w", encoding="utf-8", newline="\n", buffering=1 << 20) as o:
        out = []
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            series, value, ts = split_om_sample(line.rstrip("\n"))
            if ts is None:
                raise SystemExit("om2prom: sample without timestamp: %r" % line[:200])
            out.append("%s %s %d\n" % (series, value, om_ts_to_ms(ts)))
            n += 1
            if len(out) >= 8192:
                o.write("".join(out))
                out = []
        o.write("".join(out))
    print(n)


def cmd_free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
    s.close()


def http_get(url, timeout=60):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def cmd_wait_http(url, secs):
    deadline = time.time() + float(secs)
    while time.time() < deadline:
        try:
            http_get(url, timeout=2)
            return 0
        except Exception:
            time.sleep(0.2)
    return 1


def vm_metrics(url):
    vals = {}
    for line in http_get(url.rstrip("/") + "/metrics").decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, v = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        try:
            vals[name] = vals.get(name, 0.0) + float(v)
        except ValueError:
            pass
    return vals


def cmd_vm_metric(url, *names):
    m = vm_metrics(url)
    print(json.dumps({n: m.get(n) for n in names}))


def cmd_vm_settle(url, maxsec="1800"):
    """Wait until VictoriaMetrics has no active (force) merges and no pending rows, 5 polls in a row."""
    deadline = time.time() + float(maxsec)
    quiet = 0
    last = None
    while time.time() < deadline:
        m = vm_metrics(url)
        busy = (m.get("vm_active_merges", 0) + m.get("vm_active_force_merges", 0)
                + m.get("vm_pending_rows", 0))
        parts = m.get("vm_parts", 0)
        state = (busy, parts)
        quiet = quiet + 1 if busy == 0 and state == last else 0
        last = state
        if quiet >= 5:
            print(json.dumps({"parts": parts}))
            return 0
        time.sleep(1.0)
    print(json.dumps({"timeout": True}))
    return 1


def cmd_vm_count(url, start_ms, end_ms):
    q = urllib.parse.urlencode({"match[]": '{__name__!=""}', "start": "%.3f" % (int(start_ms) / 1000.0),
                                "end": "%.3f" % (int(end_ms) / 1000.0)})
    samples = series = 0
    with urllib.request.urlopen(url.rstrip("/") + "/api/v1/export?" + q, timeout=3600) as r:
        for line in r:
            if not line.strip():
                continue
            d = json.loads(line)
            series += 1
            samples += len(d["values"])
    print(json.dumps({"samples": samples, "series": series, "method": "/api/v1/export"}))


def cmd_vm_count_query(url, start_ms, end_ms):
    start_s, end_s = int(start_ms) / 1000.0, int(end_ms) / 1000.0
    window = int(end_s - start_s) + 2
    q = urllib.parse.urlencode({"query": 'sum(count_over_time({__name__!=""}[%ds]))' % window,
                                "time": "%.3f" % (end_s + 0.5), "nocache": "1"})
    d = json.loads(http_get(url.rstrip("/") + "/api/v1/query?" + q, timeout=3600))
    res = d["data"]["result"]
    samples = int(float(res[0]["value"][1])) if res else 0
    # /api/v1/series/count in 1.79 is approximate (counts index entries): count series with a query
    q2 = urllib.parse.urlencode({"query": 'count(count_over_time({__name__!=""}[%ds]))' % window,
                                 "time": "%.3f" % (end_s + 0.5), "nocache": "1"})
    d2 = json.loads(http_get(url.rstrip("/") + "/api/v1/query?" + q2, timeout=3600))
    res2 = d2["data"]["result"]
    series = int(float(res2[0]["value"][1])) if res2 else 0
    print(json.dumps({"samples": samples, "series": series, "method": "count_over_time queries"}))


def _unescape(v):
    return re.sub(r'\\(.)', lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v)


LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _label_tuple(text):
    """`a="1",b="x"` as sorted (name, value) pairs, empty values left out."""
    return tuple(sorted((k, _unescape(v)) for k, v in LABEL_PAIR.findall(text) if v != ""))


def input_samples(path):
    """Each sample of an OpenMetrics input: ((name, labels), value text, time in ms)."""
    keys = {}
    with open(path, "r", encoding="utf-8", newline="\n") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            series, value, ts = split_om_sample(line.rstrip("\n"))
            key = keys.get(series)
            if key is None:
                name = series.split("{", 1)[0]
                key = keys[series] = (name, _label_tuple(series[len(name):]))
            yield key, value, om_ts_to_ms(ts)


def cmd_vm_compare(url, path, start_ms, end_ms):
    """Compare every input value with what /api/v1/export returns (float64 equality)."""
    q = urllib.parse.urlencode({"match[]": '{__name__!=""}', "start": "%.3f" % (int(start_ms) / 1000.0),
                                "end": "%.3f" % (int(end_ms) / 1000.0)})
    vm = {}
    with urllib.request.urlopen(url.rstrip("/") + "/api/v1/export?" + q, timeout=3600) as r:
        for line in r:
            if not line.strip():
                continue
            d = json.loads(line)
            m = d["metric"]
            name = m.pop("__name__")
            vm[(name, tuple(sorted(m.items())))] = dict(zip(d["timestamps"], d["values"]))
    total = changed = missing = 0
    by_name = {}
    for key, value, ms in input_samples(path):
        total += 1
        got = vm.get(key, {}).get(ms)
        if got is None:
            missing += 1
        elif float(got) == float(value):
            continue
        else:
            changed += 1
        e = by_name.setdefault(key[0], [0, value, got])
        e[0] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:3]
    print(json.dumps({"samples": total, "changed": changed, "missing": missing,
                      "examples": ["%s %s -> %s" % (n, e[1], e[2]) for n, e in top]}))


def _f64_bits(value):
    """The f64's bits; every NaN the same (the text formats have one NaN)."""
    v = float(value)
    return "NaN" if v != v else struct.pack("<d", v).hex()


def cmd_vtax_compare(vtax, data_dir, table, path):
    """Compare every input value with what `vtax query TABLE --format csv` returns,
    bit for bit (the CSV prints each f64 in its shortest round-trip form)."""
    ms_of = {}
    series_of = {}
    stored = {}
    query = subprocess.Popen([vtax, "query", table, "--data-dir", data_dir, "--since", "0",
                              "--format", "csv"], stdout=subprocess.PIPE, text=True)
    rows = csv.reader(query.stdout)
    header = next(rows)
    t_at, metric_at, labels_at, value_at = (header.index(c) for c in ("time", "metric", "labels", "value"))
    for row in rows:
        t = row[t_at]
        ms = ms_of.get(t)
        if ms is None:
            when = datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))
            ms = ms_of[t] = round(when.timestamp() * 1000)
        series = series_of.get((row[metric_at], row[labels_at]))
        if series is None:
            series = series_of[(row[metric_at], row[labels_at])] = (row[metric_at], _label_tuple(row[labels_at]))
        stored[(series, ms)] = _f64_bits(row[value_at])
    if query.wait() != 0:
        sys.exit("vtax query failed")
    total = changed = missing = 0
    examples = []
    for key, value, ms in input_samples(path):
        total += 1
        got = stored.pop((key, ms), None)
        if got is None:
            missing += 1
        elif got != _f64_bits(value):
            changed += 1
            if len(examples) < 3:
                examples.append("%s %s -> bits %s" % (key[0], value, got))
    print(json.dumps({"samples": total, "changed": changed, "missing": missing,
                      "extra": len(stored), "examples": examples}))


def cmd_prom_meta(d):
    out = {"samples": 0, "series": 0, "chunks": 0, "blocks": 0}
    for p in sorted(glob.glob(os.path.join(d, "*", "meta.json"))):
        m = json.load(open(p))
        out["blocks"] += 1
        out["samples"] += m["stats"]["numSamples"]
        out["series"] += m["stats"]["numSeries"]   # summed over blocks (a series in 2 blocks counts twice)
        out["chunks"] += m["stats"]["numChunks"]
    print(json.dumps(out))


def cmd_months(start_ms, end_ms):
    a = datetime.datetime.fromtimestamp(int(start_ms) / 1000, datetime.timezone.utc)
    b = datetime.datetime.fromtimestamp(int(end_ms) / 1000, datetime.timezone.utc)
    y, m = a.year, a.month
    while (y, m) <= (b.year, b.month):
        print("%04d_%02d" % (y, m))
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)


def fmt_bytes(n):
    if n is None:
        return "-"
    return "{:,}".format(int(n))


def cmd_report(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    inputs = []
    for r in rows:
        if r["input"] not in inputs:
            inputs.append(r["input"])
    out = []
    out.append("| input | system | samples in input | samples stored | series | bytes on disk | bytes/sample | wall s | notes |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---|")
    checks = []
    for inp in inputs:
        rs = [r for r in rows if r["input"] == inp]
        bps = {}
        for r in rs:
            exp = r.get("expected_samples")
            got = r.get("stored_samples")
            b = r.get("bytes")
            per = (b / exp) if (b is not None and exp) else None
            if per is not None:
                bps[r["system"]] = per
            mark = ""
            if got is not None and exp is not None and got != exp:
                mark = " **MISMATCH**"
            if got is not None:
                got_s = fmt_bytes(got)
            else:
                got_s = "unverified" if (exp is not None and b is not None) else "-"
            out.append("| %s | %s | %s | %s%s | %s | %s | %s | %s | %s |" % (
                inp, r["system"], fmt_bytes(exp), got_s, mark,
                fmt_bytes(r.get("series")), fmt_bytes(b),
                "%.3f" % per if per is not None else "-",
                "%.1f" % r["wall_s"] if r.get("wall_s") is not None else "-",
                r.get("notes", "")))
        if not any(r.get("expected_samples") for r in rs):
            continue
        p = bps.get("promtool (Prometheus TSDB)")
        v = bps.get("VictoriaMetrics net")
        x = bps.get("vtax")
        if x is None:
            checks.append("- %s: vtax not measured." % inp)
        else:
            ok1 = p is not None and x <= p / 2
            vtax_row = next(r for r in rs if r["system"] == "vtax")
            if "values_changed" in vtax_row:
                lost = (vtax_row["values_changed"] or 0) + (vtax_row["values_missing"] or 0)
                exact = "every value bit for bit: %s" % ("PASS" if lost == 0 else "FAIL (%d not)" % lost)
            else:
                exact = "values not compared (no --check-values)"
            checks.append("- %s: vtax %.3f B/sample; <= half of Prometheus (%.3f): %s; %s"
                          " (VictoriaMetrics net, for reference: %.3f)"
                          % (inp, x, p / 2 if p else float("nan"), "PASS" if ok1 else "FAIL", exact,
                             v if v else float("nan")))
    print("\n".join(out))
    print()
    print("Bar (vtax bytes/sample <= 1/2 x Prometheus, every value kept bit for bit:"
          " --check-values compares them):")
    print("\n".join(checks))


def cmd_record(path, *kvs):
    """Append one JSON result line; values that look like numbers become numbers."""
    d = {}
    for kv in kvs:
        k, _, v = kv.partition("=")
        if v == "":
            d[k] = None
            continue
        try:
            d[k] = int(v)
        except ValueError:
            try:
                d[k] = float(v)
            except ValueError:
                d[k] = v
    with open(path, "a") as f:
        f.write(json.dumps(d) + "\n")


def cmd_get(key):
    """Print one field of the JSON object on stdin (empty if null/missing)."""
    v = json.load(sys.stdin).get(key)
    print("" if v is None else v)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    fn = {"stats": cmd_stats, "om2prom": cmd_om2prom, "free-port": cmd_free_port,
          "wait-http": cmd_wait_http, "vm-metric": cmd_vm_metric, "vm-settle": cmd_vm_settle,
          "vm-count": cmd_vm_count, "vm-count-query": cmd_vm_count_query, "prom-meta": cmd_prom_meta,
          "months": cmd_months, "report": cmd_report,
          "record": cmd_record, "get": cmd_get, "vm-compare": cmd_vm_compare,
          "vtax-compare": cmd_vtax_compare}[cmd]
    rc = fn(*args)
    sys.exit(rc or 0)


if __name__ == "__main__":
    main()
