#!/usr/bin/env python3
"""Convert a recording of Prometheus-text scrapes into one OpenMetrics file.

Usage: om_from_recording.py RAW OUT.om [--tmpdir DIR]

RAW is a concatenation of scrapes of an exporter's /metrics, each preceded by a
marker line `# SCRAPE <unix_ms>` (see /work/rec/record.py).  The output is an
OpenMetrics text file that `promtool tsdb create-blocks-from openmetrics`
accepts:

  * each metric family appears once (`# HELP` / `# TYPE` once, then all of its
    samples; families never interleave), in order of first appearance;
  * inside a family, the samples of one series (for summaries and histograms:
    of one metric, i.e. the label set without `quantile`/`le`) are contiguous
    and in increasing time order; a histogram/summary point keeps its lines
    (buckets/quantiles, _sum, _count) together in their source order;
  * every sample carries a timestamp in seconds with a millisecond fraction
    (`1763721813.123`): the scrape's marker time, or the sample's own
    millisecond timestamp when the exporter wrote one;
  * values are copied byte for byte from the source text;
  * `# EOF` at the end.

Type mapping (Prometheus text -> OpenMetrics):
  counter `x_total`         -> `# TYPE x counter`, samples keep the name `x_total`
  counter not ending _total -> `# TYPE name unknown` (OM requires the _total
                               suffix on counter samples; `unknown` is lossless)
  untyped / no TYPE line    -> `unknown`
  gauge, summary, histogram -> kept.
If two families would end up with the same OpenMetrics name (e.g. counter
`x_total` and gauge `x`), the counter falls back to `unknown` under its full
name.

Memory: pass 1 streams the recording and appends each sample to a temporary
file per family (buffered, bounded); pass 2 loads one family at a time, groups
its series and writes it out.  Peak memory is about the size of the largest
family, not of the recording.

A last line without a newline (recording still being written) is dropped, so a
truncated value can never be imported.  A sample whose timestamp is not newer
than the previous one of the same series is dropped and counted.
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
FLUSH_BYTES = 32 << 20


def ms_to_om(ms):
    """Integer milliseconds -> seconds with a 3-digit millisecond fraction."""
    if ms < 0:
        return "-" + ms_to_om(-ms)
    return "%d.%03d" % (ms // 1000, ms % 1000)


def split_sample(line):
    """Return (name, labels_raw_or_None, value, ts_ms_or_None) or None."""
    brace = line.find("{")
    if brace >= 0:
        close = line.rfind("}")
        if close < brace:
            return None
        name = line[:brace].strip()
        labels = line[brace + 1:close].strip()
        if labels.endswith(","):
            labels = labels[:-1].rstrip()
        rest = line[close + 1:].split()
    else:
        parts = line.split()
        if not parts:
            return None
        name, rest = parts[0], parts[1:]
        labels = None
    if not name or len(rest) not in (1, 2):
        return None
    ts = None
    if len(rest) == 2:
        try:
            ts = int(rest[1])
        except ValueError:
            return None
    return name, labels, rest[0], ts


def strip_labels(labels, drop):
    """Label text without the label `drop` (for summary/histogram grouping)."""
    if not labels:
        return ""
    kept = [m.group(0).strip().rstrip(",").strip() for m in LABEL_RE.finditer(labels)
            if m.group(1) != drop]
    return ",".join(kept)


def help_prom_to_om(text):
    # Prometheus text escapes only \\ and \n in HELP; OpenMetrics also escapes ".
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        out.append('\\"' if c == '"' else c)
        i += 1
    return "".join(out)


class Family:
    __slots__ = ("name", "mtype", "help", "idx", "groups", "buf", "bufbytes", "path", "samples")

    def __init__(self, name, idx, tmpdir):
        self.name = name          # Prometheus-text family name
        self.mtype = None         # Prometheus-text type (None = no TYPE line)
        self.help = None
        self.idx = idx
        self.groups = {}          # group key -> small int
        self.buf = []
        self.bufbytes = 0
        self.path = os.path.join(tmpdir, "f%06d" % idx)
        self.samples = 0

    def sample_names(self):
        n, t = self.name, self.mtype
        if t == "summary":
            return (n, n + "_sum", n + "_count")
        if t == "histogram":
            return (n + "_bucket", n + "_sum", n + "_count")
        return (n,)

    def flush(self):
        if self.buf:
            with open(self.path, "a", encoding="utf-8", newline="\n") as f:
                f.write("".join(self.buf))
            self.buf = []
            self.bufbytes = 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--tmpdir", help="directory for per-family temp files (default: next to OUT)")
    a = ap.parse_args()

    tmpdir = tempfile.mkdtemp(prefix="om_from_rec.", dir=a.tmpdir or os.path.dirname(os.path.abspath(a.out)))
    try:
        run(a.raw, a.out, tmpdir)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def run(raw, out, tmpdir):
    families = {}           # prom family name -> Family
    by_sample = {}          # sample name -> Family (from TYPE lines)
    order = []
    cur = None
    scrape_ms = None
    scrapes = samples = bad = 0
    total_buf = 0

    def family(name):
        f = families.get(name)
        if f is None:
            f = families[name] = Family(name, len(order), tmpdir)
            order.append(f)
        return f

    with open(raw, "r", encoding="utf-8", newline="\n") as src:
        for line in src:
            if not line.endswith("\n"):
                print("om_from_recording: dropping unterminated last line (%d bytes)" % len(line),
                      file=sys.stderr)
                break
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] == "SCRAPE":
                    scrape_ms = int(parts[2])
                    scrapes += 1
                    cur = None
                elif len(parts) >= 3 and parts[1] == "TYPE":
                    f = family(parts[2])
                    if f.mtype is None:
                        f.mtype = parts[3].strip() if len(parts) > 3 else "untyped"
                        for n in f.sample_names():
                            by_sample.setdefault(n, f)
                    cur = f
                elif len(parts) >= 3 and parts[1] == "HELP":
                    f = family(parts[2])
                    if f.help is None:
                        f.help = parts[3] if len(parts) > 3 else ""
                    cur = f
                continue
            if scrape_ms is None:
                bad += 1
                continue
            s = split_sample(line)
            if s is None:
                bad += 1
                print("om_from_recording: unparsable line skipped: %r" % line[:200], file=sys.stderr)
                continue
            name, labels, value, ts = s
            if cur is not None and name in cur.sample_names():
                f = cur
            else:
                f = by_sample.get(name) or family(name)
            if f.mtype == "summary":
                key = strip_labels(labels, "quantile")
            elif f.mtype == "histogram":
                key = strip_labels(labels, "le")
            else:
                key = (name, labels)
            gid = f.groups.get(key)
            if gid is None:
                gid = f.groups[key] = len(f.groups)
            text = name + ("{" + labels + "}" if labels else "") + " " + value
            rec = "%d %d %s\n" % (gid, scrape_ms if ts is None else ts, text)
            f.buf.append(rec)
            f.bufbytes += len(rec)
            total_buf += len(rec)
            f.samples += 1
            samples += 1
            if total_buf > FLUSH_BYTES:
                for g in order:
                    g.flush()
                total_buf = 0
    for g in order:
        g.flush()

    # Decide OpenMetrics names and types.
    om = []
    for f in order:
        t = f.mtype or "untyped"
        if f.samples == 0:
            continue
        if t == "counter" and f.name.endswith("_total"):
            om.append([f, f.name[:-len("_total")], "counter"])
        elif t in ("gauge", "summary", "histogram"):
            om.append([f, f.name, t])
        else:  # untyped, counter without _total, anything unknown
            om.append([f, f.name, "unknown"])
    taken = {}
    for e in om:
        if e[2] != "counter":
            taken[e[1]] = e
    for e in om:
        if e[2] == "counter":
            if e[1] in taken:
                e[1], e[2] = e[0].name, "unknown"
            taken[e[1]] = e
    fallbacks = [e[0].name for e in om if e[2] == "unknown" and (e[0].mtype or "untyped") not in ("untyped",)]

    dropped = written = 0
    with open(out, "w", encoding="utf-8", newline="\n", buffering=1 << 20) as dst:
        for f, omname, omtype in om:
            if f.help is not None:
                dst.write("# HELP %s %s\n" % (omname, help_prom_to_om(f.help)))
            dst.write("# TYPE %s %s\n" % (omname, omtype))
            groups = [[] for _ in range(len(f.groups))]
            with open(f.path, "r", encoding="utf-8", newline="\n") as tf:
                for rec in tf:
                    gid, ts, text = rec.split(" ", 2)
                    groups[int(gid)].append((int(ts), text))
            point = f.mtype in ("summary", "histogram")
            for g in groups:
                last = None
                seen = set()      # sample names within one histogram/summary point
                out_lines = []
                for ts, text in g:
                    if point:
                        if last is not None and ts < last:
                            dropped += 1
                            continue
                        if ts != last:
                            seen = set()
                        sk = text.rsplit(" ", 1)[0]
                        if sk in seen:
                            dropped += 1
                            continue
                        seen.add(sk)
                    elif last is not None and ts <= last:
                        dropped += 1
                        continue
                    last = ts
                    out_lines.append("%s %s\n" % (text[:-1], ms_to_om(ts)))
                written += len(out_lines)
                dst.write("".join(out_lines))
            os.unlink(f.path)
        dst.write("# EOF\n")

    print("om_from_recording: %d scrapes, %d samples read, %d written, %d dropped (not newer than "
          "previous sample of the series), %d bad lines, %d families, %d series-groups"
          % (scrapes, samples, written, dropped, bad, len(om), sum(len(e[0].groups) for e in om)),
          file=sys.stderr)
    if fallbacks:
        print("om_from_recording: declared 'unknown' (counter without _total or name clash): "
              + ", ".join(fallbacks), file=sys.stderr)


if __name__ == "__main__":
    main()
