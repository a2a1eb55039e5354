#!/usr/bin/env bash
# GPU smoke test, for a machine with a real NVIDIA GPU and PyTorch. CI has no
# GPU; this is not part of the tests. In order:
#   1. `nvidia-smi -q` and `vtax doctor --gpu` on the idle GPU;
#   2. the agent next to `nvidia-smi --query-gpu ... -lms 1000` and a
#      device-to-device copy that measures its own HBM bandwidth: utilisation,
#      power and clocks (agent vs nvidia-smi) and HBM bytes/s (agent vs the
#      copy) side by side for the copy's window, and whether the copy's pid
#      shows up in the agent's process series;
#   3. with `ncu` on the PATH, Nsight Compute profiling a small PyTorch program
#      while the agent keeps reading GPM: did ncu get its counters, and did the
#      agent's GPM series stay there (GPM takes no profiling lock);
#   4. with XID=1 and CuPy, a kernel that writes to an unmapped address: the
#      driver kills that one context and reports an XID (31, an MMU fault),
#      which the agent should count and store. It resets nothing, but it does
#      put an error in the kernel log: opt in;
#   5. the store the agent wrote, read back: `vtax query` and pyarrow;
#   6. what the real NVML reads cost the agent (bench/agent/gpu_overhead.py --real)
#      on idle GPUs, beside nvidia-smi reading them once a second
#      (bench/gpu/nvidia_smi_cost.py, PEER_SECS a way, default 30), then both
#      again with GPU 0 copying (OVERHEAD_BUSY=0 leaves that out), and with
#      OVERHEAD_GPM_OFF=1 the agent with GPM off; OVERHEAD_SECS (default 45)
#      is each agent window (an idle GPU reads its exact energy counter every
#      300 s: a window shorter than that leaves the read out, so the idle
#      figure of the steady cost needs OVERHEAD_SECS=300);
#   6a. (calls) single NVML calls on GPU 0, a second apart, idle and then beside
#      a copy (bench/agent/nvml_call_costs.py): what a busy GPU's second still
#      reads each tick (the process list and its count alone, GPM's sample, the
#      PCIe link), CALLS_REPEATS (default 8) of each;
#   6b. (quiet) the agent on defaults while GPU 0 idles, copies for 12 s and
#      idles again (QUIET_IDLE_SECS, default 20, each side), scraped each
#      second: GPM's figures and the PCIe link, held on quiet ticks, with
#      PASS or FAIL for what the held reads must keep true;
#   7. the transfer probe: `vtax probe-gpu` (its table, every GPU), then
#      bench/gpu/probe_vs_torch.py: the probe's host<->device, device->device
#      and launch figures beside the same transfers timed by PyTorch, PASS or
#      FAIL each. The script exits non-zero when that comparison fails.
#   8. the transfer probe inside the agent (collectors.gpu_probe on, idle_secs
#      10) on the idle GPU for PROBE_AGENT_SECS (default 45): its rows, outcome
#      counts, tax gauges and series, and the energy counter's exact reads
#      beside its integration (every 30 s: quiet_energy_interval_secs = 0)
#      from the same run.
#   9. (mps) with nvidia-cuda-mps-control on the PATH, an MPS daemon of the
#      script's own (its pipe and log under the raw files' folder, quit at
#      exit) and two PyTorch clients on GPU 0: nvidia-smi's compute apps and
#      `vtax doctor --gpu`'s process lines beside each other, PASS when the
#      doctor lists both clients (the compute list alone names the server).
#
# Usage: scripts/gpu-smoke.sh [seconds of load, default 20]
# VTAX=path/to/vtax uses a built binary instead of building one; SMOKE_DIR=dir
# keeps the raw files there (default: a new temporary folder).
# STEPS picks the steps, by name, comma- or space-separated (default: all):
#   doctor (1), agent (2 and 5: the agent under load, and its store read back),
#   ncu (3), xid (4, with XID=1), overhead (6), calls (6a), quiet (6b), probe (7),
#   probe-agent (8), mps (9).
# ncu and xid run inside the agent's window, so only with agent. PROBE_ONLY=1
# is STEPS=probe: a couple of minutes on a node of a few GPUs. PROBE_GPU=N
# compares GPU N (nvidia-smi's index, default 0) with PyTorch; PROBE_ARGS adds
# flags to bench/gpu/probe_vs_torch.py (e.g. "--launch-tolerance 0.1").
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
out=${SMOKE_DIR:-$(mktemp -d)}
mkdir -p "$out"
steps=${STEPS:-doctor agent ncu xid overhead calls quiet probe probe-agent mps}
[ "${PROBE_ONLY:-0}" = 1 ] && steps=probe
steps=" ${steps//,/ } "
want() { [[ $steps == *" $1 "* ]]; }
for step in $steps; do
  case $step in
    doctor|agent|ncu|xid|overhead|calls|quiet|probe|probe-agent|mps) ;;
    *) echo "gpu-smoke: unknown step '$step' in STEPS (doctor agent ncu xid overhead calls quiet probe probe-agent mps)" >&2; exit 2 ;;
  esac
done

if [ -z "${VTAX:-}" ]; then
  cargo build --release -p vtax
  VTAX=target/release/vtax
fi
command -v nvidia-smi >/dev/null || { echo "gpu-smoke: no nvidia-smi: not a GPU machine" >&2; exit 2; }
python3 -c 'import torch; assert torch.cuda.is_available()' \
  || { echo "gpu-smoke: PyTorch with CUDA is needed for the bandwidth load" >&2; exit 2; }

# GPU machines built for training often have no curl; Python is there (PyTorch).
fetch() {
  curl -sf --max-time 5 "$1" 2>/dev/null \
    || python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
}
now() { date +%s.%N; }

# What runs in the background (agents, scrapes, loads) is ended when the
# script exits, early (set -e) or not: a lent machine must not keep it.
background=()
# The MPS daemon of step 9, by its pipe directory, once started.
mps_pipe=
stop_background() {
  [ ${#background[@]} -eq 0 ] || kill "${background[@]}" 2>/dev/null || true
  if [ -n "$mps_pipe" ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" nvidia-cuda-mps-control 2>/dev/null || true
  fi
}
trap stop_background EXIT

# Scrapes the agent on port $1 once a second into the file $2, keeping the
# lines that match the pattern $3, each scrape headed by '### <time>', until
# the file $2.stop exists; sets scrape_pid.
scrape_each_second() {
  rm -f "$2.stop"
  ( while [ ! -e "$2.stop" ]; do
      printf '### %s\n' "$(now)"
      fetch "http://127.0.0.1:$1/metrics" | grep -E "$3" || true
      sleep 1
    done ) > "$2" &
  scrape_pid=$!
  background+=("$scrape_pid")
}

nvidia-smi -L | tee "$out/nvidia-smi-L.txt"
nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1 || true
if want doctor; then
  "$VTAX" doctor --gpu --no-collector.cgroups > "$out/doctor-gpu.txt" 2>&1 || true
  sed -n '/^gpus:/,$p' "$out/doctor-gpu.txt"
  # The GPUs on the PCI bus against those NVML lists: vtax names each one
  # it finds on the bus and not in NVML's list among the doctor's problems.
  on_bus=0
  for function in /sys/bus/pci/devices/*; do
    if [ "$(cat "$function/vendor" 2>/dev/null)" = 0x10de ]; then
      case "$(cat "$function/class" 2>/dev/null)" in 0x0300*|0x0302*) on_bus=$((on_bus + 1)) ;; esac
    fi
  done
  listed=$(grep -c '^GPU ' "$out/nvidia-smi-L.txt" || true)
  unlisted=$(grep -c '^  - gpu: .*/bus/pci/devices/' "$out/doctor-gpu.txt" || true)
  echo "== NVIDIA GPUs on the PCI bus: $on_bus; listed by nvidia-smi: $listed; named by vtax as not listed: $unlisted"
fi

if want agent; then
port=19433
"$VTAX" run --data-dir "$out/data" --web.listen-address "127.0.0.1:$port" \
  --no-collector.cgroups --no-collector.infiniband > "$out/vtax.log" 2>&1 &
vtax_pid=$!
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,power.draw,clocks.sm,clocks.mem,memory.used,pcie.link.gen.current,pcie.link.width.current \
  --format=csv,noheader,nounits -lms 1000 > "$out/nvidia-smi.csv" &
smi_pid=$!
background+=("$vtax_pid" "$smi_pid")

# The GPU and collector series, once a second.
scrape_each_second "$port" "$out/vtax-scrapes.txt" '^vtax_(gpu_|collector_duration_seconds\{collector="gpu")'
sleep 4

python3 bench/gpu/hbm_copy_load.py --seconds "$seconds" > "$out/copy.txt" &
copy_pid=$!
background+=("$copy_pid")
sleep $((seconds / 2 + 2))
fetch "http://127.0.0.1:$port/metrics" > "$out/metrics-under-load.txt" || true
wait $copy_pid
sleep 3

# Nsight Compute beside the agent: ncu takes the GPU's profiling counters for
# each kernel it replays, GPM is meant to go on regardless.
if want ncu && command -v ncu >/dev/null && [ "${NSIGHT:-1}" != 0 ]; then
  cat > "$out/ncu_load.py" <<'PY'
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 8
while time.time() < end:
    (a @ a).sum().item()
PY
  echo "start=$(now)" > "$out/ncu-window.txt"
  set +e
  timeout 180 ncu --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed \
    -c 20 python3 "$out/ncu_load.py" > "$out/ncu.txt" 2>&1
  echo "rc=$?" >> "$out/ncu-window.txt"
  set -e
  echo "end=$(now)" >> "$out/ncu-window.txt"
  sleep 2
fi

if want xid && [ "${XID:-0}" = 1 ]; then
  python3 - > "$out/xid.txt" 2>&1 <<'PY' || true
import cupy
poke = cupy.RawKernel(r'extern "C" __global__ void poke() { *(volatile int *)0x10 = 1; }', "poke")
poke((1,), (1,), ())
try:
    cupy.cuda.runtime.deviceSynchronize()
    print("the kernel did not fault")
except Exception as e:
    print(f"the kernel faulted, as meant: {e}")
PY
  sleep 3
  fetch "http://127.0.0.1:$port/metrics" | grep -E '^vtax_gpu_(xid|health)' > "$out/xid-metrics.txt" || true
  dmesg 2>/dev/null | grep -i xid > "$out/dmesg-xid.txt" || true
fi

touch "$out/vtax-scrapes.txt.stop"
wait $scrape_pid || true
kill $vtax_pid $smi_pid 2>/dev/null || true
wait $vtax_pid 2>/dev/null || true

for table in gpu gpu_info gpu_process gpu_nvlink gpu_clock_event gpu_health gpu_event gpu_xid; do
  "$VTAX" query "$table" --data-dir "$out/data" --format csv > "$out/query-$table.csv" 2>&1 || true
done
python3 - "$out/data" > "$out/pyarrow.txt" 2>&1 <<'PY' || true
import collections, glob, sys
import pyarrow.parquet as pq
rows = collections.Counter()
for path in glob.glob(f"{sys.argv[1]}/tables/*/*/*.parquet"):
    rows[path.split("/tables/")[1].split("/")[0]] += pq.read_table(path).num_rows
for table, n in sorted(rows.items()):
    if table.startswith("gpu"):
        print(f"{table:<18} {n} rows")
PY

python3 - "$out" <<'PY'
import csv, datetime, os, re, statistics, sys
out = sys.argv[1]
copy = dict(kv.split("=") for kv in open(f"{out}/copy.txt").read().split())
copy_pid = copy["pid"]
start, end, copy_bw = float(copy["start"]), float(copy["end"]), float(copy["hbm_bytes_per_second"])

scrapes = []  # (time, metric, labels, value)
t = None
for line in open(f"{out}/vtax-scrapes.txt"):
    if line.startswith("### "):
        t = float(line[4:]); continue
    m = re.match(r'(\w+)\{(.*)\} (\S+)$', line.strip())
    if t is not None and m:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        scrapes.append((t, m.group(1), labels, float(m.group(3))))

def agent(metric, gpu, lo, hi, **want):
    return [v for (ts, name, labels, v) in scrapes
            if name == metric and lo <= ts <= hi and labels.get("gpu", gpu) == gpu
            and all(labels.get(k) == w for k, w in want.items())]

# Skip the first and last second of the load: both tools average over their own windows.
lo, hi = start + 2, end - 1
smi = {}
for row in csv.reader(open(f"{out}/nvidia-smi.csv")):
    row = [c.strip() for c in row]
    try:
        ts = datetime.datetime.strptime(row[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except (ValueError, IndexError):
        continue
    if not (lo <= ts <= hi):
        continue
    for i, name in enumerate(["utilization.gpu", "utilization.memory", "power.draw", "clocks.sm", "clocks.mem", "memory.used", "pcie.gen", "pcie.width"], start=2):
        try:
            smi.setdefault((name, row[1]), []).append(float(row[i]))
        except ValueError:
            pass
mean = lambda v: statistics.fmean(v) if v else float("nan")
gpus = sorted({l.get("gpu") for (_, n, l, _) in scrapes if n == "vtax_gpu_utilization_ratio"})
print(f"\nload window {hi - lo:.1f} s; the copy measured {copy_bw / 1e12:.3f} TB/s of HBM traffic")
print(f"{'gpu':>3} {'metric':<24} {'vtax':>14} {'nvidia-smi / copy':>18}")
for g in gpus:
    a = lambda metric, **want: mean(agent(metric, g, lo, hi, **want))
    s = lambda name: mean(smi.get((name, g), []))
    rows = [
        ("utilisation %", a("vtax_gpu_utilization_ratio") * 100, s("utilization.gpu")),
        ("memory busy %", a("vtax_gpu_memory_utilization_ratio") * 100, s("utilization.memory")),
        ("power W", a("vtax_gpu_power_watts"), s("power.draw")),
        ("SM clock MHz", a("vtax_gpu_sm_clock_hertz") / 1e6, s("clocks.sm")),
        ("memory clock MHz", a("vtax_gpu_memory_clock_hertz") / 1e6, s("clocks.mem")),
        ("memory used MiB", a("vtax_gpu_memory_used_bytes") / 2**20, s("memory.used")),
        ("PCIe gen", a("vtax_gpu_pcie_link_gen"), s("pcie.gen")),
        ("PCIe width", a("vtax_gpu_pcie_link_width"), s("pcie.width")),
        ("HBM TB/s", a("vtax_gpu_hbm_bytes_per_second") / 1e12, copy_bw / 1e12 if g == "0" else float("nan")),
        ("HBM peak TB/s", a("vtax_gpu_hbm_peak_bytes_per_second") / 1e12, float("nan")),
        ("DRAM ratio (GPM)", a("vtax_gpu_dram_bandwidth_ratio"), float("nan")),
        ("SM active (GPM)", a("vtax_gpu_sm_active_ratio"), float("nan")),
        ("NVLink links up", a("vtax_gpu_nvlink_links_up"), float("nan")),
        ("NVLink links product", a("vtax_gpu_nvlink_links_product"), float("nan")),
        ("copy pid's memory GiB", a("vtax_gpu_process_used_memory_bytes", pid=copy_pid) / 2**30, 4.0),  # against its buffers alone: NVML adds the CUDA context
        ("copy pid's SM share", a("vtax_gpu_process_sm_utilization_ratio", pid=copy_pid), float("nan")),
    ]
    for name, x, y in rows:
        print(f"{g:>3} {name:<24} {x:>14.3f} {y:>18.3f}")
    info = [l for (_, n, l, _) in scrapes if n == "vtax_gpu_info" and l.get("gpu") == g]
    if info:
        l = info[-1]
        print(f"{g:>3} {l.get('name')}, {l.get('architecture')}, virtualization {l.get('virtualization_mode')}, MIG {l.get('mig')}, driver {l.get('driver_version')}")
durations = [v for (_, n, _, v) in scrapes if n == "vtax_collector_duration_seconds"]
if durations:
    print(f"gpu collector run: mean {mean(durations) * 1e3:.2f} ms, max {max(durations) * 1e3:.2f} ms over {len(durations)} scrapes")

if os.path.exists(f"{out}/ncu-window.txt"):
    w = dict(line.strip().split("=") for line in open(f"{out}/ncu-window.txt"))
    n_lo, n_hi = float(w["start"]), float(w["end"])
    ncu = open(f"{out}/ncu.txt", errors="replace").read()
    profiled = len(re.findall(r"dram__throughput\.avg\.pct_of_peak_sustained_elapsed", ncu))
    errors = [l for l in ncu.splitlines() if "==ERROR==" in l or "==WARNING==" in l]
    polls = [ts for (ts, n, _, _) in scrapes if n == "vtax_gpu_utilization_ratio" and n_lo <= ts <= n_hi]
    gpm = [ts for (ts, n, _, _) in scrapes if n == "vtax_gpu_sm_active_ratio" and n_lo <= ts <= n_hi]
    print(f"\nNsight Compute beside the agent ({n_hi - n_lo:.0f} s): ncu exit {w['rc']}, {profiled} kernels profiled")
    for l in errors[:5]:
        print(f"  ncu: {l}")
    print(f"  agent scrapes in that window: {len(polls)}; with GPM SM activity: {len(gpm)}")
if os.path.exists(f"{out}/xid.txt"):
    print("\nXID provoked: " + open(f"{out}/xid.txt").read().strip().splitlines()[-1])
    for name in ("dmesg-xid.txt", "xid-metrics.txt", "query-gpu_xid.csv"):
        lines = open(f"{out}/{name}").read().strip().splitlines() if os.path.exists(f"{out}/{name}") else []
        print(f"  {name}: {len(lines)} lines")
        for line in lines[:6]:
            print(f"    {line}")
print()
print(open(f"{out}/pyarrow.txt").read().rstrip())
PY
grep -iE 'warn|error' "$out/vtax.log" | head -20 || true
fi

if want overhead && [ -e bench/agent/gpu_overhead.py ] && [ "${OVERHEAD:-1}" != 0 ]; then
  echo
  overhead_secs=${OVERHEAD_SECS:-45}
  echo "idle:"
  python3 bench/agent/gpu_overhead.py --real --seconds "$overhead_secs" --vtax "$VTAX" | tee "$out/overhead.txt"
  # The peer on the same GPUs: nvidia-smi reading them once a second.
  python3 bench/gpu/nvidia_smi_cost.py --seconds "${PEER_SECS:-30}" | tee "$out/nvidia-smi-cost.txt" || true
  if [ "${OVERHEAD_BUSY:-1}" != 0 ]; then
    # The same beside one process copying within GPU 0 at ~99% utilisation.
    echo "busy (GPU 0 copying):"
    python3 bench/gpu/hbm_copy_load.py --seconds "$((overhead_secs + ${PEER_SECS:-30} + 30))" \
      > "$out/overhead-busy-load.txt" 2>&1 &
    load_pid=$!
    background+=("$load_pid")
    sleep 5
    python3 bench/agent/gpu_overhead.py --real --seconds "$overhead_secs" --vtax "$VTAX" | tee "$out/overhead-busy.txt"
    python3 bench/gpu/nvidia_smi_cost.py --seconds "${PEER_SECS:-30}" --ways loop | tee "$out/nvidia-smi-cost-busy.txt" || true
    wait "$load_pid" || true
    cat "$out/overhead-busy-load.txt"
  fi
  if [ "${OVERHEAD_GPM_OFF:-0}" != 0 ]; then
    # GPM's share of it: the same with GPM off.
    printf '[collectors.gpu]\ngpm = false\n' > "$out/gpm-off.toml"
    echo "with gpm = false:"
    python3 bench/agent/gpu_overhead.py --real --seconds "$overhead_secs" --vtax "$VTAX" \
      --config "$out/gpm-off.toml" | tee "$out/overhead-gpm-off.txt"
  fi
fi

# What a busy GPU's second still reads each tick, call by call: is the process
# count alone cheaper than the list, and what do GPM's sample and the link cost
# beside a copy?
if want calls; then
  echo
  calls_only="running_compute,GPM: sample only,GPM: sample, 8 GPU,current_pcie_link"
  calls_repeats=${CALLS_REPEATS:-8}
  echo "single NVML calls, idle:"
  python3 bench/agent/nvml_call_costs.py --repeats "$calls_repeats" --gap-seconds 1 \
    --only "$calls_only" | tee "$out/calls-idle.txt" || true
  python3 bench/gpu/hbm_copy_load.py --seconds "$((calls_repeats * 8 + 20))" \
    > "$out/calls-busy-load.txt" 2>&1 &
  load_pid=$!
  background+=("$load_pid")
  sleep 5
  echo "single NVML calls, GPU 0 copying:"
  python3 bench/agent/nvml_call_costs.py --repeats "$calls_repeats" --gap-seconds 1 \
    --only "$calls_only" | tee "$out/calls-busy.txt" || true
  kill "$load_pid" 2>/dev/null || true
  wait "$load_pid" 2>/dev/null || true
fi

# A quiet GPU (no process, no kernel) reads GPM and its PCIe link once per
# slow_reads_interval_secs and holds them; the tick work starts reads them
# again. The agent on defaults, GPU 0 idle, then copying, then idle, one
# scrape a second: GPM's figures and the link, each second.
if want quiet; then
  echo
  port=19435
  "$VTAX" run --data-dir "$out/quiet-data" --web.listen-address "127.0.0.1:$port" \
    --no-collector.cgroups --no-collector.infiniband > "$out/quiet.log" 2>&1 &
  quiet_pid=$!
  background+=("$quiet_pid")
  scrape_each_second "$port" "$out/quiet-scrapes.txt" \
    '^vtax_gpu_(utilization_ratio|sm_active_ratio|dram_bandwidth_ratio|pcie_rx_bytes_per_second|pcie_link_gen|pcie_link_width)\{gpu="0"'
  sleep "${QUIET_IDLE_SECS:-20}"
  python3 bench/gpu/hbm_copy_load.py --seconds 12 > "$out/quiet-load.txt" 2>&1
  sleep "${QUIET_IDLE_SECS:-20}"
  touch "$out/quiet-scrapes.txt.stop"; wait "$scrape_pid" || true
  kill -TERM "$quiet_pid"; wait "$quiet_pid" || true
  cat "$out/quiet-load.txt"
  python3 - "$out/quiet-scrapes.txt" <<'PY'
import math, re, sys
names = ["utilization_ratio", "sm_active_ratio", "dram_bandwidth_ratio",
         "pcie_rx_bytes_per_second", "pcie_link_gen", "pcie_link_width"]
rows = []
for line in open(sys.argv[1]):
    if line.startswith("###"):
        rows.append((float(line.split()[1]), {}))
        continue
    m = re.match(r"vtax_gpu_(\w+)\{[^}]*\} (\S+)", line)
    if m and rows:
        rows[-1][1][m.group(1)] = float(m.group(2))
start = rows[0][0] if rows else 0.0
print("s      " + "  ".join(f"{n[:12]:>12}" for n in names))
for t, row in rows:
    print(f"{t - start:5.1f}  " + "  ".join(f"{row.get(n, math.nan):12.4g}" for n in names))
# Judge from the agent's third scrape with a sample on: its first tick has
# no GPM figures by design.
sampled = [r for _, r in rows if "utilization_ratio" in r][2:]
gaps = [i for i, r in enumerate(sampled) if "sm_active_ratio" not in r]
checks = [
    ("GPM null on one tick at most (scraped at most twice), as work starts",
     len(gaps) <= 2 and (not gaps or gaps[-1] - gaps[0] <= 1)),
    ("the PCIe link on every scrape", all("pcie_link_gen" in r for r in sampled)),
    ("SM activity over 0.5 while utilisation is 0.9 or more",
     all(r["sm_active_ratio"] > 0.5 for r in sampled
         if r["utilization_ratio"] >= 0.9 and "sm_active_ratio" in r)),
    ("SM activity under 0.01 on quiet scrapes away from the work",
     all(r["sm_active_ratio"] < 0.01 for k, r in enumerate(sampled)
         if all(s.get("utilization_ratio") == 0 for s in sampled[max(0, k - 3):k + 1])
         and "sm_active_ratio" in r)),
    ("some scrapes busy", any(r["utilization_ratio"] >= 0.9 for r in sampled)),
]
for what, ok in checks:
    print(f"quiet: {'PASS' if ok else 'FAIL'}  {what}")
PY
fi

# The transfer probe on idle GPUs: its own table first (every GPU and pair),
# then one GPU beside PyTorch. Each under a timeout: a wedged driver call
# must not hold a lent machine.
probe_rc=0
if want probe; then
  echo
  set +e
  timeout 180 "$VTAX" probe-gpu > "$out/probe-gpu.txt" 2>&1
  echo "rc=$?" >> "$out/probe-gpu.txt"
  cat "$out/probe-gpu.txt"
  read -ra probe_args <<< "${PROBE_ARGS:-}"
  timeout 300 python3 bench/gpu/probe_vs_torch.py --vtax "$VTAX" --gpu "${PROBE_GPU:-0}" \
    --timeout 120 --json-out "$out/probe-vs-torch.json" ${probe_args[@]+"${probe_args[@]}"} 2>&1 \
    | tee "$out/probe-vs-torch.txt"
  probe_rc=${PIPESTATUS[0]}
  set -e
  echo "probe_vs_torch exit $probe_rc"
fi
# The transfer probe in the running agent, on the idle GPU: it should probe
# each GPU once idle_secs after the start, and write rows, outcome counts and
# tax gauges. The same run's gpu rows show the energy counter's exact reads
# (every 30 s, the quiet cadence turned off for the step) beside the
# integrated counter in between.
if want probe-agent; then
  echo
  cat > "$out/probe-agent.toml" <<'TOML'
[collectors.gpu_probe]
enabled = true
interval_secs = 1
idle_secs = 10
# The idle GPU's exact energy reads every 30 s, as at work, so that the
# step's run holds some beside the integration (quiet: every 300 s).
[collectors.gpu]
quiet_energy_interval_secs = 0
TOML
  port=19434
  "$VTAX" run --config "$out/probe-agent.toml" --data-dir "$out/probe-data" \
    --web.listen-address "127.0.0.1:$port" --no-collector.cgroups --no-collector.infiniband \
    > "$out/probe-agent.log" 2>&1 &
  agent_pid=$!
  background+=("$agent_pid")
  sleep "${PROBE_AGENT_SECS:-45}"
  fetch "http://127.0.0.1:$port/metrics" | grep -E '^vtax_(gpu_probe|tax_probe)' > "$out/probe-agent-metrics.txt" || true
  kill -TERM "$agent_pid"; wait "$agent_pid" || true
  for table in gpu_probe gpu_probe_outcome gpu_probe_peer; do
    echo "== $table"
    "$VTAX" query "$table" --data-dir "$out/probe-data" --since 1h --format csv 2>&1 || true
  done | tee "$out/probe-agent-rows.txt"
  echo "== series"; cat "$out/probe-agent-metrics.txt"
  "$VTAX" query tax --data-dir "$out/probe-data" --since 1h --format csv 2>&1 | tail -n 3 > "$out/probe-agent-tax.csv" || true
  echo "== tax (last rows)"; cat "$out/probe-agent-tax.csv"
  "$VTAX" query gpu --data-dir "$out/probe-data" --since 1h --format csv \
    --fields power_watts,energy_joules,energy_exact_age_seconds,energy_integration_error_joules \
    > "$out/probe-agent-energy.csv" 2>&1 || true
  echo "== energy: exact reads (age 0) and the integration error at each"
  awk -F, 'NR == 1 || $NF != "" && $(NF-1) == 0' "$out/probe-agent-energy.csv"
  grep -iE 'probe|error' "$out/probe-agent.log" | head -n 20 || true
fi

# MPS: the compute list names only the server; the agent reads the MPS list
# beside it, so the doctor should list each client.
mps_rc=0
if want mps; then
  echo
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "gpu-smoke: no nvidia-cuda-mps-control on the PATH: the mps step is left out"
  else
    mps_pipe="$out/mps/pipe"
    mkdir -p "$mps_pipe" "$out/mps/log"
    export CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps/log"
    nvidia-cuda-mps-control -d
    clients=()
    for i in 1 2; do
      CUDA_VISIBLE_DEVICES=0 python3 -c '
import os, sys, time, torch
a = torch.randn(4096, 4096, device="cuda")
open(sys.argv[1], "w").write(str(os.getpid()))
end = time.time() + 20
while time.time() < end:
    (a @ a).sum().item()
' "$out/mps/client-$i.pid" > "$out/mps/client-$i.txt" 2>&1 &
      clients+=("$!")
      background+=("$!")
    done
    sleep 10
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$out/mps-smi.csv" 2>&1 || true
    "$VTAX" doctor --gpu --no-collector.cgroups > "$out/mps-doctor.txt" 2>&1 || true
    wait "${clients[@]}" || true
    echo quit | nvidia-cuda-mps-control || true
    mps_pipe=
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    echo "== nvidia-smi compute apps under MPS"; cat "$out/mps-smi.csv"
    echo "== vtax doctor --gpu, its process lines"; grep -E '^ *process ' "$out/mps-doctor.txt" || true
    for i in 1 2; do
      pid=$(cat "$out/mps/client-$i.pid" 2>/dev/null || echo none)
      if grep -qE "^ *process $pid " "$out/mps-doctor.txt"; then
        echo "PASS: MPS client $i (pid $pid) listed by the doctor"
      else
        echo "FAIL: MPS client $i (pid $pid) not listed by the doctor"; mps_rc=1
      fi
    done
  fi
fi
echo "gpu-smoke: raw files in $out"
[ "$probe_rc" -ne 0 ] && exit "$probe_rc"
exit "$mps_rc"
