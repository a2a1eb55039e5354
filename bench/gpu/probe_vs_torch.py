#!/usr/bin/env python3
"""`vtax probe-gpu` beside the same transfers timed by PyTorch, on one GPU.

The probe's bar (issue 34): its host->device, device->host and
device->device figures agree within 10% with PyTorch's on the same machine,
and its empty-kernel launch latency with a PyTorch-timed one.

Both sides time alike:
- each large copy (pinned host memory for host<->device) between two CUDA
  events on a non-default stream, `--warmup` uncounted copies first, then
  `--repeats` timed ones; the figure is bytes / the median copy time;
- device->device counts HBM traffic, 2 x bytes / the median time (the copy
  reads and writes every byte);
- the small round trip (4 bytes host->device then device->host, then a
  stream synchronise) and the kernel launch (launch, then a stream
  synchronise) are host-timed with a monotonic clock; median of
  `--latency-repeats`; the launch is also timed between two events.

The "empty kernel" on PyTorch's side is `torch.cuda._sleep(0)`: a one-thread
kernel that reads the clock and returns at once. PyTorch has no empty kernel
of its own, and any tensor op (`add_`, `zero_`) does real work over memory;
compiling one (cpp_extension, CuPy) needs a toolkit the GPU machines may not
have. Its launch goes through PyTorch's Python binding and dispatcher, so its
host-timed figure carries that overhead, which the probe's direct driver call
does not: the launch rows are set against `--launch-tolerance`, looser than
the copies' `--tolerance`, and the difference is printed either way.

The probe runs first (`vtax probe-gpu --json --gpu N`, the same sizes), then
PyTorch in a child process; each under a timeout, so a wedged driver call
ends this script rather than hanging it. The two are matched by PCI bus id.

Usage:
  bench/gpu/probe_vs_torch.py --vtax .devbin/vtax [--gpu 0] [--copy-bytes N]
      [--repeats N] [--warmup N] [--latency-repeats N] [--tolerance 0.10]
      [--launch-tolerance 0.5] [--timeout 300] [--json-out FILE] [--dry-run]

Exit status: 0 all rows PASS, 1 a row FAILs, 2 a side could not run, 3 timeout.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_COPY_BYTES = 256 << 20


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vtax", default=".devbin/vtax", help="the vtax binary")
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU (nvidia-smi's)")
    p.add_argument("--copy-bytes", type=int, default=DEFAULT_COPY_BYTES)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--latency-repeats", type=int, default=200)
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="largest relative difference of a copy figure that passes")
    p.add_argument("--launch-tolerance", type=float, default=0.5,
                   help="largest relative difference of a launch figure that passes")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for each side")
    p.add_argument("--json-out", help="also write both sides' figures and the verdicts here")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    p.add_argument("--torch-worker", help=argparse.SUPPRESS)  # internal: the child's mode
    return p.parse_args(argv)


def vtax_command(a):
    return [a.vtax, "probe-gpu", "--json", "--gpu", str(a.gpu),
            "--copy-bytes", str(a.copy_bytes), "--repeats", str(a.repeats),
            "--warmup", str(a.warmup), "--latency-repeats", str(a.latency_repeats)]


def worker_command(a, bus_id):
    return [sys.executable, os.path.abspath(__file__), "--torch-worker", bus_id,
            "--gpu", str(a.gpu), "--copy-bytes", str(a.copy_bytes), "--repeats", str(a.repeats),
            "--warmup", str(a.warmup), "--latency-repeats", str(a.latency_repeats)]


def normalise_bus_id(text):
    """`dddddddd:bb:dd.f` in lowercase, as vtax writes it; None if unreadable."""
    try:
        domain, bus, rest = text.strip().split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"
    except ValueError:
        return None


def torch_device_for(torch, bus_id, nvml_index):
    """The torch device index of the GPU at `bus_id`."""
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        if all(hasattr(p, k) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            if normalise_bus_id(f"{p.pci_domain_id:x}:{p.pci_bus_id:x}:{p.pci_device_id:x}.0") == bus_id:
                return i
    # Older PyTorch does not say: CUDA_DEVICE_ORDER=PCI_BUS_ID (set before
    # torch loads) numbers the visible GPUs as NVML does when all are visible.
    if torch.cuda.device_count() == 1:
        return 0
    return nvml_index


def torch_worker(a):
    """Times the probe's transfers with PyTorch; prints one JSON object."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import torch

    bus_id = a.torch_worker
    index = torch_device_for(torch, bus_id, a.gpu)
    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    n = a.copy_bytes
    stream = torch.cuda.Stream(device=dev)
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    small_host = torch.empty(4, dtype=torch.uint8).pin_memory()
    small_dev = src[:4]
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def event_median(op, warmup, repeats):
        times = []
        for i in range(warmup + repeats):
            start.record(stream)
            op()
            end.record(stream)
            end.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    def host_median(op, warmup, repeats):
        times = []
        for i in range(warmup + repeats):
            t = time.perf_counter()
            op()
            if i >= warmup:
                times.append(time.perf_counter() - t)
        return statistics.median(times)

    def round_trip():
        small_dev.copy_(small_host, non_blocking=True)
        small_host.copy_(small_dev, non_blocking=True)
        stream.synchronize()

    def launch_and_wait():
        torch.cuda._sleep(0)
        stream.synchronize()

    latency_warmup = max(a.warmup, 1) * 10
    with torch.cuda.stream(stream):
        h2d = event_median(lambda: src.copy_(host, non_blocking=True), a.warmup, a.repeats)
        d2h = event_median(lambda: host.copy_(src, non_blocking=True), a.warmup, a.repeats)
        d2d = event_median(lambda: dst.copy_(src), a.warmup, a.repeats)
        rt = host_median(round_trip, latency_warmup, a.latency_repeats)
        launch = host_median(launch_and_wait, latency_warmup, a.latency_repeats)
        launch_event = event_median(lambda: torch.cuda._sleep(0), latency_warmup, a.latency_repeats)
    print(json.dumps({
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": index,
        "name": torch.cuda.get_device_name(index),
        "host_to_device_bytes_per_second": n / h2d,
        "device_to_host_bytes_per_second": n / d2h,
        "device_to_device_bytes_per_second": 2 * n / d2d,
        "small_copy_round_trip_seconds": rt,
        "kernel_launch_seconds": launch,
        "kernel_launch_event_seconds": launch_event,
    }))


def run_side(name, cmd, timeout):
    """Runs one side; its parsed JSON, or an exit status and a line saying why."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, 3, f"{name}: no answer in {timeout:.0f} s (killed): {' '.join(cmd)}"
    except OSError as e:
        return None, 2, f"{name}: could not run {cmd[0]}: {e}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        # vtax prints its JSON even when part of the probe failed: use what it has.
        try:
            return json.loads(done.stdout), 0, f"{name}: exit {done.returncode}: {why}"
        except ValueError:
            return None, 2, f"{name}: exit {done.returncode}: {why}"
    try:
        return json.loads(done.stdout), 0, None
    except ValueError as e:
        return None, 2, f"{name}: unreadable output ({e}): {done.stdout[:200]!r}"


def vtax_figures(report, gpu):
    """The probe's figures of NVML GPU `gpu`: (bus id, name, {what: value}, error)."""
    for g in report.get("gpus", []):
        if g.get("gpu") == gpu:
            figures = {}
            for m in g.get("measurements", []):
                key = "bytes_per_second" if "bytes_per_second" in m else "seconds"
                figures[f"{m['what']}_{key}"] = m.get(key)
                if m.get("ratio") is not None:
                    figures[f"{m['what']}_ratio"] = m["ratio"]
                    figures[f"{m['what']}_peak"] = m["peak"]["label"]
            return g.get("pci_bus_id"), g.get("name"), figures, g.get("error")
    return None, None, {}, f"vtax reported no GPU {gpu}"


ROWS = [
    # (key, label, unit scale, unit, tolerance attribute or None for no verdict)
    ("host_to_device_bytes_per_second", "host->device", 1e9, "GB/s", "tolerance"),
    ("device_to_host_bytes_per_second", "device->host", 1e9, "GB/s", "tolerance"),
    ("device_to_device_bytes_per_second", "device->device (2x bytes)", 1e9, "GB/s", "tolerance"),
    ("kernel_launch_seconds", "kernel launch + sync", 1e-6, "us", "launch_tolerance"),
    ("kernel_launch_event_seconds", "kernel launch (events)", 1e-6, "us", "launch_tolerance"),
    ("small_copy_round_trip_seconds", "4 B round trip", 1e-6, "us", None),
]


def compare(a, ours, theirs):
    """Rows of (label, ours, theirs, unit, relative difference, verdict)."""
    rows = []
    for key, label, scale, unit, tol in ROWS:
        x, y = ours.get(key), theirs.get(key)
        if x is None or y is None or y == 0:
            rows.append((label, x, y, scale, unit, None, "MISSING" if tol else "-"))
            continue
        diff = (x - y) / y
        verdict = "-" if tol is None else ("PASS" if abs(diff) <= getattr(a, tol) else "FAIL")
        rows.append((label, x, y, scale, unit, diff, verdict))
    return rows


def main(argv):
    a = parse_args(argv)
    if a.torch_worker:
        torch_worker(a)
        return 0
    if a.dry_run:
        print("would run: " + " ".join(vtax_command(a)))
        print("then: " + " ".join(worker_command(a, "<the GPU's bus id from vtax>")))
        print(f"each with a timeout of {a.timeout:.0f} s; PASS within {a.tolerance:.0%} "
              f"(copies), {a.launch_tolerance:.0%} (launch)")
        return 0

    report, status, why = run_side("vtax", vtax_command(a), a.timeout)
    if report is None:
        print(f"probe_vs_torch: {why}", file=sys.stderr)
        return status
    if why:
        print(f"probe_vs_torch: {why}", file=sys.stderr)
    bus_id, name, ours, error = vtax_figures(report, a.gpu)
    if error:
        print(f"probe_vs_torch: vtax: GPU {a.gpu}: {error}", file=sys.stderr)
        return 2
    theirs, status, why = run_side("torch", worker_command(a, bus_id), a.timeout)
    if theirs is None:
        print(f"probe_vs_torch: {why}", file=sys.stderr)
        return status

    rows = compare(a, ours, theirs)
    print(f"GPU {a.gpu} {name} {bus_id}; PyTorch {theirs['torch']} (CUDA {theirs['cuda']}) "
          f"device {theirs['device']}")
    print(f"{a.copy_bytes} B copies, median of {a.repeats} after {a.warmup} warm-up; "
          f"latencies median of {a.latency_repeats}")
    print(f"{'measurement':<28}{'vtax':>12}{'torch':>12}  {'unit':<5}{'vtax-torch':>11}  verdict")
    for label, x, y, scale, unit, diff, verdict in rows:
        fx = "-" if x is None else f"{x / scale:.2f}"
        fy = "-" if y is None else f"{y / scale:.2f}"
        fd = "-" if diff is None else f"{diff:+.1%}"
        print(f"{label:<28}{fx:>12}{fy:>12}  {unit:<5}{fd:>11}  {verdict}")
    for what in ("host_to_device", "device_to_host", "device_to_device"):
        if f"{what}_ratio" in ours:
            print(f"vtax: {what} at {ours[what + '_ratio']:.2f} of {ours[what + '_peak']}")
    cost = report.get("cost", {})
    print(f"vtax probe cost: {cost.get('wall_seconds', 0):.2f} s wall, "
          f"{cost.get('gpu_busy_seconds', 0):.3f} s GPU busy, "
          f"{cost.get('thread_cpu_seconds', 0):.2f} s thread CPU, "
          f"{cost.get('process_cpu_seconds', 0):.2f} s process CPU")
    failed = [r for r in rows if r[6] in ("FAIL", "MISSING")]
    print("RESULT: " + ("PASS" if not failed else "FAIL (" + ", ".join(r[0] for r in failed) + ")"))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"vtax": report, "torch": theirs,
                       "rows": [dict(zip(("measurement", "vtax", "torch", "scale", "unit",
                                          "relative_difference", "verdict"), r)) for r in rows]},
                      f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
