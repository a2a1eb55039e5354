#!/usr/bin/env bash
# GPU smoke test, for a machine with a real NVIDIA GPU and PyTorch: runs the
# agent next to `nvidia-smi --query-gpu ... -lms` and a device-to-device copy
# that measures its own HBM bandwidth, then prints the three side by side for
# the copy's window: utilisation, power and clocks (agent vs nvidia-smi) and
# HBM bytes/s (agent vs the copy). CI has no GPU; this is not part of the tests.
#
# Usage: scripts/gpu-smoke.sh [seconds of load, default 20]
# VTAX=path/to/vtax uses a built binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"

if [ -z "${VTAX:-}" ]; then
  cargo build --release -p vtax
  VTAX=target/release/vtax
fi
command -v nvidia-smi >/dev/null || { echo "gpu-smoke: no nvidia-smi: not a GPU machine" >&2; exit 2; }
python3 -c 'import torch; assert torch.cuda.is_available()' \
  || { echo "gpu-smoke: PyTorch with CUDA is needed for the bandwidth load" >&2; exit 2; }

nvidia-smi -L | tee "$out/nvidia-smi-L.txt"
"$VTAX" doctor --gpu --no-collector.cgroups > "$out/doctor-gpu.txt" 2>&1 || true
port=19433
"$VTAX" run --data-dir "$out/data" --web.listen-address "127.0.0.1:$port" \
  --no-collector.cgroups --no-collector.infiniband > "$out/vtax.log" 2>&1 &
vtax_pid=$!
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,power.draw,clocks.sm,clocks.mem,memory.used,pcie.link.gen.current,pcie.link.width.current \
  --format=csv,noheader,nounits -lms 1000 > "$out/nvidia-smi.csv" &
smi_pid=$!
trap 'kill $vtax_pid $smi_pid 2>/dev/null || true' EXIT

# Scrape the agent once a second while the load runs.
( for _ in $(seq $((seconds + 8))); do
    printf '### %s\n' "$(date +%s.%N)"
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^vtax_gpu_(utilization_ratio|power_watts|sm_clock_hertz|memory_clock_hertz|hbm_bytes_per_second|hbm_peak_bytes_per_second|dram_bandwidth_ratio|sm_active_ratio|pcie_link_gen|pcie_link_width)\{' || true
    sleep 1
  done ) > "$out/vtax-scrapes.txt" &
scrape_pid=$!
sleep 4

python3 - "$seconds" > "$out/copy.txt" <<'PY'
import sys, time, torch
seconds = float(sys.argv[1])
n = 2 << 30  # 2 GiB per buffer
a = torch.empty(n, dtype=torch.uint8, device="cuda")
b = torch.empty_like(a)
b.copy_(a); torch.cuda.synchronize()
start = time.time(); copies = 0
while time.time() - start < seconds:
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
    copies += 20
end = time.time()
# A device-to-device copy reads and writes every byte: 2 n bytes of HBM traffic.
print(f"start={start:.3f} end={end:.3f} hbm_bytes_per_second={2 * n * copies / (end - start):.6e}")
PY
sleep 3
wait $scrape_pid || true
kill $vtax_pid $smi_pid 2>/dev/null || true
wait $vtax_pid 2>/dev/null || true

python3 - "$out" <<'PY'
import csv, re, sys, statistics, datetime
out = sys.argv[1]
copy = dict(kv.split("=") for kv in open(f"{out}/copy.txt").read().split())
start, end, copy_bw = float(copy["start"]), float(copy["end"]), float(copy["hbm_bytes_per_second"])
# Skip the first and last second of the load: both tools average over their own windows.
lo, hi = start + 2, end - 1
agent = {}
t = None
for line in open(f"{out}/vtax-scrapes.txt"):
    if line.startswith("### "):
        t = float(line[4:]); continue
    if t is None or not (lo <= t <= hi):
        continue
    m = re.match(r'(vtax_gpu_\w+)\{gpu="(\d+)".*\} (\S+)', line)
    if m:
        agent.setdefault((m.group(1), m.group(2)), []).append(float(m.group(3)))
smi = {}
for row in csv.reader(open(f"{out}/nvidia-smi.csv")):
    row = [c.strip() for c in row]
    try:
        ts = datetime.datetime.strptime(row[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        continue
    if not (lo <= ts <= hi):
        continue
    for i, name in enumerate(["utilization.gpu", "utilization.memory", "power.draw", "clocks.sm", "clocks.mem", "memory.used", "pcie.gen", "pcie.width"], start=2):
        try:
            smi.setdefault((name, row[1]), []).append(float(row[i]))
        except ValueError:
            pass
mean = lambda v: statistics.fmean(v) if v else float("nan")
gpus = sorted({g for (_, g) in agent} | {g for (_, g) in smi})
print(f"load window {hi - lo:.1f} s; the copy measured {copy_bw / 1e12:.3f} TB/s of HBM traffic")
print(f"{'gpu':>3} {'metric':<22} {'vtax':>14} {'nvidia-smi / copy':>18}")
for g in gpus:
    rows = [
        ("utilisation %", mean(agent.get(("vtax_gpu_utilization_ratio", g), [])) * 100, mean(smi.get(("utilization.gpu", g), []))),
        ("power W", mean(agent.get(("vtax_gpu_power_watts", g), [])), mean(smi.get(("power.draw", g), []))),
        ("SM clock MHz", mean(agent.get(("vtax_gpu_sm_clock_hertz", g), [])) / 1e6, mean(smi.get(("clocks.sm", g), []))),
        ("memory clock MHz", mean(agent.get(("vtax_gpu_memory_clock_hertz", g), [])) / 1e6, mean(smi.get(("clocks.mem", g), []))),
        ("PCIe gen", mean(agent.get(("vtax_gpu_pcie_link_gen", g), [])), mean(smi.get(("pcie.gen", g), []))),
        ("HBM TB/s", mean(agent.get(("vtax_gpu_hbm_bytes_per_second", g), [])) / 1e12, copy_bw / 1e12 if g == "0" else float("nan")),
        ("HBM peak TB/s", mean(agent.get(("vtax_gpu_hbm_peak_bytes_per_second", g), [])) / 1e12, float("nan")),
        ("DRAM ratio (GPM)", mean(agent.get(("vtax_gpu_dram_bandwidth_ratio", g), [])), float("nan")),
        ("SM active (GPM)", mean(agent.get(("vtax_gpu_sm_active_ratio", g), [])), float("nan")),
    ]
    for name, a, b in rows:
        print(f"{g:>3} {name:<22} {a:>14.3f} {b:>18.3f}")
PY
echo "gpu-smoke: raw files in $out"
