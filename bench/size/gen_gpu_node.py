#!/usr/bin/env python3
"""Generate a synthetic, deterministic OpenMetrics file shaped like one GPU node.

Usage: gen_gpu_node.py OUT.om [--series 10000] [--seconds 900] [--step 1]
                              [--seed 42] [--start 1763719200] [--cpus 224]

What one 8-GPU (HGX H100-like) node would expose through dcgm-exporter and
prometheus-node-exporter, scraped every --step seconds for --seconds seconds:

  * per GPU (8): 40 DCGM fields (utilisation, clocks, temperatures, power,
    energy counter, framebuffer, ECC / row-remap, PCIe, profiling ratios);
  * per NVLink link (8 GPUs x 18 links): tx/rx byte counters and four error
    counters (`link` label);
  * InfiniBand (8 HCA ports): the node_exporter infiniband collector's counters
    and gauges;
  * host: memory, network, NVMe disks, filesystems, load, hwmon temperatures;
  * per logical CPU (--cpus, default 224): cpu/guest seconds per mode,
    frequency, softnet, schedstat;
  * node_interrupts_total{cpu,devices,type} fill up to exactly --series
    series (if --series is smaller than the rest, --cpus is reduced and the
    series list is cut at --series).

Value shapes: utilisation integers 0-100 in plateaus driven by a shared
training-job phase schedule (all 8 GPUs busy/stall together, per-GPU noise),
power in W with 3 decimals, integer temperatures that follow power slowly,
SM clocks from a small set of MHz values, monotonically increasing counters
(energy in mJ as integers, byte counters with varying increments, error
counters mostly constant with rare increments), long constant gauges, ratios
with 2 decimals.  DCGM values are written like dcgm-exporter (integers as
integers, fixed decimals); node_exporter values like client_golang
(shortest float, `%g` with exponent from 1e6: `1.234567e+09`).

Timestamps: scrape i is at start + i*step + 0.137 s + jitter (Gaussian, sigma
2 ms, clipped to +-8 ms), identical for all series of one scrape, written as
seconds with a millisecond fraction.

dcgm-exporter declares its counters `counter` although the names have no
`_total`; OpenMetrics forbids that, so they are declared `unknown` here with
the original name (what om_from_recording.py does with such families too).
Everything is derived from --seed: the same arguments give the same bytes.
"""

import argparse
import math
import random
import sys


# ---------------------------------------------------------------- formatting

def go_g(x):
    """strconv.FormatFloat(x, 'g', -1, 64), as client_golang writes values."""
    if x != x:
        return "NaN"
    if x == math.inf:
        return "+Inf"
    if x == -math.inf:
        return "-Inf"
    if x == 0:
        return "0"
    r = repr(float(x))
    sign = ""
    if r[0] == "-":
        sign, r = "-", r[1:]
    if "e" in r:
        mant, e = r.split("e")
        e = int(e)
    else:
        mant, e = r, 0
    ip, _, fp = mant.partition(".")
    full = ip + fp
    dp = len(ip) + e
    stripped = full.lstrip("0")
    dp -= len(full) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    exp = dp - 1
    if exp < -4 or exp >= 6:
        m = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return "%s%se%s%02d" % (sign, m, "-" if exp < 0 else "+", abs(exp))
    if dp <= 0:
        return sign + "0." + "0" * (-dp) + digits
    if dp >= len(digits):
        return sign + digits + "0" * (dp - len(digits))
    return sign + digits[:dp] + "." + digits[dp:]


def ms_to_om(ms):
    return "%d.%03d" % (ms // 1000, ms % 1000)


# ---------------------------------------------------------------- value shapes

class Ctx:
    def __init__(self, seed, T, ts_ms):
        self.seed, self.T, self.ts_ms = seed, T, ts_ms
        self.dt = [1.0] + [(ts_ms[i] - ts_ms[i - 1]) / 1000.0 for i in range(1, T)]
        self.step = (ts_ms[1] - ts_ms[0]) / 1000.0 if T > 1 else 1.0

    def rng(self, *key):
        return random.Random("%s|%s" % (self.seed, "|".join(map(str, key))))


def plateaus(rng, T, mean_len, draw, first=None):
    """Values constant over stretches of geometric length (mean mean_len steps)."""
    out, v = [], (draw() if first is None else first)
    p = 1.0 / max(mean_len, 1.0)
    for _ in range(T):
        if rng.random() < p:
            v = draw()
        out.append(v)
    return out


def job_schedule(ctx):
    """Node-wide training job: busy plateaus, short stalls (eval/ckpt/data), idle gaps."""
    rng = ctx.rng("job")
    T, step = ctx.T, ctx.step
    load, t = [], 0
    state = "busy"
    while t < T:
        if state == "busy":
            n = max(1, int(rng.expovariate(1.0 / (150.0 / step))))
            lvl = rng.uniform(0.9, 1.0)
            load += [lvl] * n
            state = "stall" if rng.random() < 0.85 else "idle"
        elif state == "stall":
            n = max(1, int(rng.expovariate(1.0 / (10.0 / step))))
            load += [rng.uniform(0.05, 0.45)] * n
            state = "busy"
        else:
            n = max(1, int(rng.expovariate(1.0 / (60.0 / step))))
            load += [0.0] * n
            state = "busy"
        t += n
    return load[:T]


def clamp(v, lo, hi):
    return lo if v < lo else hi if v > hi else v


def counter_ints(rng, start, incs):
    out, v = [], start
    for d in incs:
        v += d
        out.append(v)
    return out


def rare_counter(rng, T, start, p):
    """Error-style counter: constant, with rare small increments."""
    out, v = [], start
    for _ in range(T):
        if rng.random() < p:
            v += rng.choice((1, 1, 1, 2, 3))
        out.append(v)
    return out


# ---------------------------------------------------------------- the node

GPU_MODEL = "NVIDIA H100 80GB HBM3"
HOST = "gpu-node-017"
DRIVER = "550.90.07"
PCI = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
FB_TOTAL = 81559


class Builder:
    def __init__(self):
        self.families = []   # (name, type, help, [(labels, fn)])
        self.index = {}

    def add(self, name, mtype, help_, labels, fn):
        f = self.index.get(name)
        if f is None:
            f = (name, mtype, help_, [])
            self.index[name] = f
            self.families.append(f)
        f[3].append((labels, fn))

    def count(self):
        return sum(len(f[3]) for f in self.families)


def lbl(**kw):
    return ",".join('%s="%s"' % (k, v) for k, v in kw.items())


def build(ctx, n_series, n_cpus):
    T = ctx.T
    job = job_schedule(ctx)
    b = Builder()

    # ---------------- GPUs
    gpu_labels = []
    for g in range(8):
        r = ctx.rng("uuid", g)
        uuid = "GPU-%08x-%04x-%04x-%04x-%012x" % (r.getrandbits(32), r.getrandbits(16),
                                                  r.getrandbits(16), r.getrandbits(16), r.getrandbits(48))
        gpu_labels.append('gpu="%d",UUID="%s",pci_bus_id="00000000:%s:00.0",device="nvidia%d",'
                          'modelName="%s",Hostname="%s",DCGM_FI_DRIVER_VERSION="%s"'
                          % (g, uuid, PCI[g], g, GPU_MODEL, HOST, DRIVER))

    gpu_cache = {}

    def gpu_state(g):
        """Per-GPU derived signals shared by several fields (computed once)."""
        if g in gpu_cache:
            return gpu_cache[g]
        r = ctx.rng("gpu", g)
        skew = r.uniform(-0.03, 0.02)
        load = [clamp(x + skew + r.gauss(0, 0.01), 0.0, 1.0) if x > 0 else 0.0 for x in job]
        util, u = [], None
        for x in load:
            target = int(round(100 * x))
            if u is None or abs(target - u) > 3 or r.random() < 0.08:
                u = clamp(target + r.choice((-1, 0, 0, 1)), 0, 100)
            util.append(u)
        power = [70.0 + 610.0 * x + r.gauss(0, 12.0 if x > 0.5 else 1.5) for x in load]
        temp, t = [], 34.0 + 0.055 * power[0] + r.gauss(0, 1.0)
        for p in power:
            t += (34.0 + 0.055 * p - t) * 0.04
            temp.append(int(round(t)))
        clocks = []
        c = 1980
        for x in load:
            if x < 0.02:
                c = 345
            elif r.random() < 0.03 or c == 345:
                c = r.choice((1980, 1980, 1980, 1755, 1590)) if x > 0.5 else r.choice((1980, 1410))
            clocks.append(c)
        gpu_cache[g] = (load, util, power, temp, clocks)
        return gpu_cache[g]

    def gfield(name, help_, fn, mtype="gauge"):
        for g in range(8):
            b.add(name, mtype, help_, gpu_labels[g], (lambda g=g: fn(g, ctx.rng(name, g))))

    gfield("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).",
           lambda g, r: [str(c) for c in gpu_state(g)[4]])
    gfield("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g, r: ["2619"] * T)
    gfield("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).",
           lambda g, r: [str(t + 4) for t in gpu_state(g)[3]])
    gfield("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).",
           lambda g, r: [str(t) for t in gpu_state(g)[3]])
    gfield("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).",
           lambda g, r: ["%.3f" % p for p in gpu_state(g)[2]])
    gfield("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda g, r: ["700.000"] * T)

    def energy(g, r):
        power = gpu_state(g)[2]
        e = r.randrange(10**10, 3 * 10**11)
        out = []
        for p, d in zip(power, ctx.dt):
            e += int(p * d * 1000)
            out.append(str(e))
        return out
    gfield("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
           "Total energy consumption since boot (in mJ).", energy, "unknown")
    gfield("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.",
           lambda g, r: [str(v) for v in rare_counter(r, T, r.choice((0, 0, 0, 4, 17)), 0.0005)], "unknown")
    gfield("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g, r: [str(u) for u in gpu_state(g)[1]])

    def copy_util(g, r):
        return [str(clamp(int(u * 0.35) + r.choice((0, 0, 1, -1)), 0, 100)) if u else "0"
                for u in gpu_state(g)[1]]
    gfield("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", copy_util)
    gfield("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", lambda g, r: ["0"] * T)
    gfield("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", lambda g, r: ["0"] * T)
    gfield("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
           lambda g, r: ["13" if g == 5 else "0"] * T)

    def fb_used(g):
        r = ctx.rng("fb", g)
        load = gpu_state(g)[0]
        base = r.randrange(70000, 78000)
        out, v = [], base
        for x in load:
            if x == 0.0:
                v = 0
            elif v == 0 or r.random() < 0.004:
                v = base + r.randrange(-512, 512)
            out.append(v)
        return out
    gfield("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
           lambda g, r: [str(FB_TOTAL - 561 - u) for u in fb_used(g)])
    gfield("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
           lambda g, r: [str(u) for u in fb_used(g)])
    gfield("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", lambda g, r: ["561"] * T)
    for name, help_, start in (
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", (0, 0, 0, 2)),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", (0,)),
            ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors.", (0, 3, 11)),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.", (0,))):
        gfield(name, help_, (lambda g, r, s=start: [str(r.choice(s))] * T), "unknown")
    gfield("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors.",
           lambda g, r: [str(r.choice((0, 0, 0, 1)))] * T, "unknown")
    gfield("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors.",
           lambda g, r: ["0"] * T, "unknown")
    gfield("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed",
           lambda g, r: ["0"] * T)

    def nvl_total(g, r):
        load = gpu_state(g)[0]
        v = r.randrange(10**12, 10**14)
        out = []
        for x, d in zip(load, ctx.dt):
            v += int(x * d * r.uniform(2.0e11, 3.2e11))
            out.append(str(v))
        return out
    gfield("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
           "Total number of NVLink bandwidth counters for all lanes.", nvl_total, "unknown")

    def throttle(g, r):
        load = gpu_state(g)[0]
        cur, out = 0, []
        for x in load:
            if x == 0.0:
                cur = 1          # idle
            elif r.random() < 0.02:
                cur = r.choice((0, 0, 0, 4, 4, 32))
            elif cur == 1:
                cur = 0
            out.append(str(cur))
        return out
    gfield("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons.", throttle)
    gfield("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation.", lambda g, r: ["5"] * T)
    gfield("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width.", lambda g, r: ["16"] * T)
    gfield("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vGPU License status", lambda g, r: ["0"] * T)

    def ratio(scale, noise):
        def fn(g, r):
            out, last = [], None
            for x in gpu_state(g)[0]:
                if x == 0.0:
                    v = 0.0
                elif last is not None and r.random() < 0.4:
                    v = last
                else:
                    v = clamp(x * scale + r.gauss(0, noise), 0.0, 1.0)
                last = v
                out.append("%.2f" % v)
            return out
        return fn
    for name, help_, scale, noise in (
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", 0.99, 0.01),
            ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", 0.93, 0.02),
            ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", 0.41, 0.02),
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", 0.52, 0.03),
            ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.", 0.61, 0.03),
            ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the fp64 pipes are active.", 0.0, 0.0),
            ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the fp32 pipes are active.", 0.11, 0.01),
            ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the fp16 pipes are active.", 0.04, 0.01)):
        gfield(name, help_, ratio(scale, noise))

    def rate_bytes(lo, hi, idle):
        def fn(g, r):
            return [str(int(x * r.uniform(lo, hi)) if x > 0 else r.randrange(0, idle + 1))
                    for x in gpu_state(g)[0]]
        return fn
    gfield("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus (bytes/s).",
           rate_bytes(1.1e9, 3.8e9, 40000))
    gfield("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus (bytes/s).",
           rate_bytes(2.0e9, 9.5e9, 90000))
    gfield("DCGM_FI_PROF_NVLINK_TX_BYTES", "The rate of data transmitted over NVLink (bytes/s).",
           rate_bytes(1.2e11, 1.7e11, 0))
    gfield("DCGM_FI_PROF_NVLINK_RX_BYTES", "The rate of data received over NVLink (bytes/s).",
           rate_bytes(1.2e11, 1.7e11, 0))

    # ---------------- NVLink, per link
    def link_bytes(g, l, r):
        load = gpu_state(g)[0]
        v = r.randrange(10**13, 10**15)
        out = []
        for x, d in zip(load, ctx.dt):
            if x > 0:
                v += int(d * x * r.uniform(6.0e9, 9.5e9))
            elif r.random() < 0.1:
                v += r.randrange(64, 4096, 64)
            out.append(str(v))
        return out
    link_kinds = (
        ("DCGM_FI_DEV_NVLINK_TX_BYTES", "NVLink link bytes transmitted.", link_bytes),
        ("DCGM_FI_DEV_NVLINK_RX_BYTES", "NVLink link bytes received.", link_bytes),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT", "NVLink link flow-control CRC errors.",
         lambda g, l, r: [str(v) for v in rare_counter(r, T, r.choice((0, 0, 0, 0, 1, 7)), 0.0002)]),
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT", "NVLink link data CRC errors.",
         lambda g, l, r: [str(v) for v in rare_counter(r, T, 0, 0.00005)]),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT", "NVLink link replay errors.",
         lambda g, l, r: [str(v) for v in rare_counter(r, T, r.choice((0, 0, 2)), 0.0001)]),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT", "NVLink link recovery errors.",
         lambda g, l, r: ["0"] * T),
    )
    for name, help_, fn in link_kinds:
        for g in range(8):
            for l in range(18):
                b.add(name, "unknown", help_, gpu_labels[g] + ',link="%d"' % l,
                      (lambda g=g, l=l, fn=fn, name=name: fn(g, l, ctx.rng(name, g, l))))

    # ---------------- InfiniBand (node_exporter infiniband collector)
    busy = [x for x in job]

    def ib_counter(lo, hi, idle_p=0.2, idle_amt=(1, 40)):
        def fn(p, r):
            v = r.randrange(10**6, 10**13)
            out = []
            for x, d in zip(busy, ctx.dt):
                if x > 0.5:
                    v += int(d * r.uniform(lo, hi))
                elif r.random() < idle_p:
                    v += r.randrange(*idle_amt)
                out.append(go_g(float(v)))
            return out
        return fn

    def ib_const(values):
        return lambda p, r: [go_g(float(r.choice(values)))] * T

    def ib_rare(p_inc):
        return lambda p, r: [go_g(float(v)) for v in rare_counter(r, T, r.choice((0, 0, 0, 1, 5)), p_inc)]

    ib = (
        ("node_infiniband_port_data_received_bytes_total", "counter", "Number of data octets received on all links", ib_counter(4.0e9, 2.2e10)),
        ("node_infiniband_port_data_transmitted_bytes_total", "counter", "Number of data octets transmitted on all links", ib_counter(4.0e9, 2.2e10)),
        ("node_infiniband_port_packets_received_total", "counter", "Number of packets received on all VLs by this port (including errors)", ib_counter(1.0e6, 5.4e6)),
        ("node_infiniband_port_packets_transmitted_total", "counter", "Number of packets transmitted on all VLs from this port (including errors)", ib_counter(1.0e6, 5.4e6)),
        ("node_infiniband_unicast_packets_received_total", "counter", "Number of unicast packets received (including errors)", ib_counter(1.0e6, 5.4e6)),
        ("node_infiniband_unicast_packets_transmitted_total", "counter", "Number of unicast packets transmitted (including errors)", ib_counter(1.0e6, 5.4e6)),
        ("node_infiniband_multicast_packets_received_total", "counter", "Number of multicast packets received (including errors)", ib_counter(0, 3, 0.05, (1, 3))),
        ("node_infiniband_multicast_packets_transmitted_total", "counter", "Number of multicast packets transmitted (including errors)", ib_counter(0, 2, 0.02, (1, 2))),
        ("node_infiniband_port_transmit_wait_total", "counter", "Number of ticks during which the port had data to transmit but no data was sent during the entire tick", ib_counter(1e3, 9e4, 0.01, (1, 100))),
        ("node_infiniband_link_downed_total", "counter", "Number of times the link failed to recover from an error state and went down", ib_const((0, 0, 1))),
        ("node_infiniband_link_error_recovery_total", "counter", "Number of times the link successfully recovered from an error state", ib_const((0, 0, 2))),
        ("node_infiniband_local_link_integrity_errors_total", "counter", "Number of times that the count of local physical errors exceeded the threshold specified by LocalPhyErrors.", ib_const((0,))),
        ("node_infiniband_port_constraint_errors_received_total", "counter", "Number of packets received on the switch physical port that are discarded", ib_const((0,))),
        ("node_infiniband_port_constraint_errors_transmitted_total", "counter", "Number of packets not transmitted from the switch physical port", ib_const((0,))),
        ("node_infiniband_port_errors_received_total", "counter", "Number of packets containing an error that were received on this port", ib_rare(0.0003)),
        ("node_infiniband_port_receive_remote_physical_errors_total", "counter", "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port.", ib_const((0,))),
        ("node_infiniband_port_receive_switch_relay_errors_total", "counter", "Number of packets that could not be forwarded by the switch.", ib_const((0,))),
        ("node_infiniband_excessive_buffer_overrun_errors_total", "counter", "Number of times that OverrunErrors consecutive flow control update periods occurred, each having at least one overrun error.", ib_const((0,))),
        ("node_infiniband_vl15_dropped_total", "counter", "Number of incoming VL15 packets dropped due to resource limitations.", ib_const((0,))),
        ("node_infiniband_symbol_error_total", "counter", "Number of minor link errors detected on one or more physical lanes.", ib_rare(0.0002)),
        ("node_infiniband_physical_state_id", "gauge", "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)", ib_const((5,))),
        ("node_infiniband_state_id", "gauge", "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)", ib_const((4,))),
        ("node_infiniband_rate_bytes_per_second", "gauge", "Maximum signal transfer rate", ib_const((5e10,))),
    )
    for name, mtype, help_, fn in ib:
        for p in range(8):
            b.add(name, mtype, help_, lbl(device="mlx5_%d" % p, port="1"),
                  (lambda p=p, fn=fn, name=name: fn(p, ctx.rng(name, p))))
    for p in range(8):
        b.add("node_infiniband_info", "gauge", "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
              lbl(board_id="MT_0000000838", device="mlx5_%d" % p, firmware_version="28.39.2048", hca_type="MT4129"),
              lambda: ["1"] * T)

    # ---------------- host
    def walk(start, step_p, amt, lo, hi, quantum=1):
        def fn(r):
            v, out = start(r), []
            for _ in range(T):
                if r.random() < step_p:
                    v = clamp(v + r.randint(-amt, amt) * quantum, lo, hi)
                out.append(go_g(float(v)))
            return out
        return fn

    def hconst(v):
        return lambda r: [go_g(float(v))] * T

    def hcounter(start, lo, hi, p=1.0, scale=1.0):
        def fn(r):
            v, out = start(r) if callable(start) else start, []
            for x, d in zip(job, ctx.dt):
                if r.random() < p:
                    v += int(d * r.uniform(lo, hi) * (0.3 + x))
                out.append(go_g(v * scale) if scale != 1.0 else go_g(float(v)))
            return out
        return fn

    def host(name, mtype, help_, labels, fn):
        b.add(name, mtype, help_, labels, (lambda: fn(ctx.rng(name, labels))))

    PAGE = 4096
    mem = (
        ("MemTotal", hconst(2164115488768)), ("MemFree", walk(lambda r: r.randrange(10**11, 10**12) // PAGE * PAGE, 0.9, 20000, 10**10, 2 * 10**12, PAGE)),
        ("MemAvailable", walk(lambda r: r.randrange(10**12, 2 * 10**12) // PAGE * PAGE, 0.9, 20000, 10**10, 2 * 10**12, PAGE)),
        ("Buffers", walk(lambda r: r.randrange(10**8, 10**9) // PAGE * PAGE, 0.05, 10, 0, 10**10, PAGE)),
        ("Cached", walk(lambda r: r.randrange(10**11, 10**12) // PAGE * PAGE, 0.5, 5000, 0, 2 * 10**12, PAGE)),
        ("SwapCached", hconst(0)), ("Active", walk(lambda r: r.randrange(10**11, 10**12) // PAGE * PAGE, 0.8, 5000, 0, 2 * 10**12, PAGE)),
        ("Inactive", walk(lambda r: r.randrange(10**11, 10**12) // PAGE * PAGE, 0.6, 5000, 0, 2 * 10**12, PAGE)),
        ("Dirty", walk(lambda r: r.randrange(10**5, 10**8) // PAGE * PAGE, 0.7, 3000, 0, 10**9, PAGE)),
        ("Writeback", walk(lambda r: 0, 0.02, 50, 0, 10**8, PAGE)),
        ("AnonPages", walk(lambda r: r.randrange(10**11, 5 * 10**11) // PAGE * PAGE, 0.8, 3000, 0, 10**12, PAGE)),
        ("Mapped", walk(lambda r: r.randrange(10**9, 10**10) // PAGE * PAGE, 0.1, 200, 0, 10**11, PAGE)),
        ("Shmem", walk(lambda r: r.randrange(10**10, 10**11) // PAGE * PAGE, 0.05, 100, 0, 10**12, PAGE)),
        ("Slab", walk(lambda r: r.randrange(10**9, 10**10) // PAGE * PAGE, 0.5, 100, 0, 10**11, PAGE)),
        ("SReclaimable", walk(lambda r: r.randrange(10**9, 10**10) // PAGE * PAGE, 0.4, 100, 0, 10**11, PAGE)),
        ("SUnreclaim", walk(lambda r: r.randrange(10**9, 10**10) // PAGE * PAGE, 0.3, 50, 0, 10**11, PAGE)),
        ("KernelStack", walk(lambda r: r.randrange(10**7, 10**8) // 16384 * 16384, 0.1, 3, 0, 10**9, 16384)),
        ("PageTables", walk(lambda r: r.randrange(10**8, 10**9) // PAGE * PAGE, 0.3, 20, 0, 10**10, PAGE)),
        ("Committed_AS", walk(lambda r: r.randrange(10**11, 10**12) // PAGE * PAGE, 0.6, 2000, 0, 10**13, PAGE)),
        ("VmallocUsed", walk(lambda r: r.randrange(10**8, 10**9) // PAGE * PAGE, 0.01, 5, 0, 10**10, PAGE)),
        ("VmallocTotal", hconst(35184372087808)), ("HugePages_Total", hconst(0)), ("HugePages_Free", hconst(0)),
        ("Hugepagesize", hconst(2097152)), ("SwapTotal", hconst(0)), ("SwapFree", hconst(0)),
        ("HardwareCorrupted", hconst(0)), ("Percpu", hconst(1012924416)), ("Mlocked", hconst(0)),
    )
    for field, fn in mem:
        name = "node_memory_%s_bytes" % field.replace("(", "_").replace(")", "")
        host(name, "gauge", "Memory information field %s_bytes." % field, "", fn)

    ifaces = ["eno1", "eno2", "lo", "docker0", "ibp24s0", "ibp41s0", "ibp58s0", "ibp93s0",
              "ibp154s0", "ibp171s0", "ibp186s0", "ibp219s0"]
    net = (
        ("receive_bytes", 2e5, 5e8), ("transmit_bytes", 2e5, 5e8), ("receive_packets", 200, 4e5),
        ("transmit_packets", 200, 4e5),
    )
    for field, lo, hi in net:
        for i in ifaces:
            host("node_network_%s_total" % field, "counter", "Network device statistic %s." % field,
                 lbl(device=i), hcounter(lambda r: r.randrange(10**6, 10**13), lo, hi, 0.95))
    for field in ("receive_errs", "transmit_errs", "receive_drop", "transmit_drop", "receive_multicast"):
        for i in ifaces:
            host("node_network_%s_total" % field, "counter", "Network device statistic %s." % field,
                 lbl(device=i), hcounter(lambda r: r.choice((0, 0, 0, 12, 3391)), 1, 3, 0.002))
    for i in ifaces:
        host("node_network_up", "gauge", "Value is 1 if operstate is 'up', 0 otherwise.", lbl(device=i), hconst(1))
        host("node_network_mtu_bytes", "gauge", "mtu_bytes value of /sys/class/net/<iface>.", lbl(device=i),
             hconst(65520 if i.startswith("ib") else 65536 if i == "lo" else 1500))
        host("node_network_speed_bytes", "gauge", "speed_bytes value of /sys/class/net/<iface>.", lbl(device=i),
             hconst(5e10 if i.startswith("ib") else 3.125e9))
    disks = ["nvme%dn1" % i for i in range(9)]
    dsk = (
        ("reads_completed_total", 10, 3000), ("writes_completed_total", 10, 2000),
        ("read_bytes_total", 4e4, 2e9), ("written_bytes_total", 4e4, 8e8),
        ("reads_merged_total", 0, 20), ("writes_merged_total", 0, 40),
        ("discards_completed_total", 0, 1),
    )
    for field, lo, hi in dsk:
        for d in disks:
            host("node_disk_%s" % field, "counter", "The total number of %s." % field.replace("_", " "),
                 lbl(device=d), hcounter(lambda r: r.randrange(10**5, 10**11), lo, hi, 0.9))
    for field in ("io_time_seconds_total", "read_time_seconds_total", "write_time_seconds_total",
                  "io_time_weighted_seconds_total"):
        for d in disks:
            host("node_disk_%s" % field, "counter", "Total seconds spent doing %s." % field,
                 lbl(device=d), hcounter(lambda r: r.randrange(10**5, 10**8), 1, 900, 0.9, 0.001))
    for d in disks:
        host("node_disk_io_now", "gauge", "The number of I/Os currently in progress.", lbl(device=d),
             walk(lambda r: 0, 0.3, 3, 0, 64))
    mounts = [("/", "/dev/md0", "ext4", 1.9e12), ("/boot/efi", "/dev/nvme8n1p1", "vfat", 5.35e8),
              ("/raid", "/dev/md1", "ext4", 2.8e13), ("/run", "tmpfs", "tmpfs", 2.16e11),
              ("/dev/shm", "tmpfs", "tmpfs", 1.08e12), ("/var/lib/docker", "overlay", "overlay", 1.9e12)]
    for mp, dev, fs, size in mounts:
        L = lbl(device=dev, fstype=fs, mountpoint=mp)
        host("node_filesystem_size_bytes", "gauge", "Filesystem size in bytes.", L, hconst(size))
        host("node_filesystem_avail_bytes", "gauge", "Filesystem space available to non-root users in bytes.", L,
             walk(lambda r, s=size: int(s * r.uniform(0.2, 0.9)) // PAGE * PAGE, 0.3, 4000, 0, size, PAGE))
        host("node_filesystem_free_bytes", "gauge", "Filesystem free space in bytes.", L,
             walk(lambda r, s=size: int(s * r.uniform(0.2, 0.9)) // PAGE * PAGE, 0.3, 4000, 0, size, PAGE))
        host("node_filesystem_files", "gauge", "Filesystem total file nodes.", L, hconst(int(size / 16384)))
        host("node_filesystem_files_free", "gauge", "Filesystem total free file nodes.", L,
             walk(lambda r, s=size: int(s / 16384 * 0.9), 0.05, 20, 0, int(size / 16384)))
        host("node_filesystem_readonly", "gauge", "Filesystem read-only status.", L, hconst(0))
        host("node_filesystem_device_error", "gauge", "Whether an error occurred while getting statistics for the given device.", L, hconst(0))

    def loadavg(tau):
        def fn(r):
            v, out = r.uniform(5, 30), []
            for x in job:
                v += (x * 48 + r.gauss(0, 3) - v) * (1 - math.exp(-ctx.step / tau))
                out.append(go_g(round(max(v, 0.0), 2)))
            return out
        return fn
    host("node_load1", "gauge", "1m load average.", "", loadavg(60))
    host("node_load5", "gauge", "5m load average.", "", loadavg(300))
    host("node_load15", "gauge", "15m load average.", "", loadavg(900))
    host("node_procs_running", "gauge", "Number of processes in runnable state.", "", walk(lambda r: 40, 1.0, 8, 1, 250))
    host("node_procs_blocked", "gauge", "Number of processes blocked waiting for I/O to complete.", "", walk(lambda r: 0, 0.2, 1, 0, 12))
    host("node_context_switches_total", "counter", "Total number of context switches.", "",
         hcounter(lambda r: r.randrange(10**10, 10**12), 2e5, 9e5))
    host("node_intr_total", "counter", "Total number of interrupts serviced.", "",
         hcounter(lambda r: r.randrange(10**10, 10**12), 2e5, 1.2e6))
    host("node_forks_total", "counter", "Total number of forks.", "",
         hcounter(lambda r: r.randrange(10**6, 10**8), 5, 200))
    host("node_boot_time_seconds", "gauge", "Node boot time, in unixtime.", "", hconst(ctx.ts_ms[0] // 1000 - 613_274))
    host("node_time_seconds", "gauge", "System time in seconds since epoch (1970).", "",
         lambda r: [go_g((ms + 2) / 1000.0 + r.randrange(0, 1000) * 1e-6) for ms in ctx.ts_ms])
    host("node_entropy_available_bits", "gauge", "Bits of available entropy.", "", hconst(256))
    for sock in range(2):
        host("node_hwmon_temp_celsius", "gauge", "Hardware monitor for temperature (input)",
             lbl(chip="platform_coretemp_%d" % sock, sensor="temp1"), walk(lambda r: r.randrange(45, 60), 0.3, 1, 30, 95))
        for core in range(56):
            host("node_hwmon_temp_celsius", "gauge", "Hardware monitor for temperature (input)",
                 lbl(chip="platform_coretemp_%d" % sock, sensor="temp%d" % (core + 2)),
                 walk(lambda r: r.randrange(40, 58), 0.3, 1, 30, 95))

    fixed = b.count()
    per_cpu = 19
    if n_series < fixed + per_cpu * n_cpus:
        n_cpus = max(1, (n_series - fixed) // per_cpu)

    # ---------------- per CPU
    cpu_cache = {}

    def cpu_profile(c):
        if c in cpu_cache:
            return cpu_cache[c]
        r = ctx.rng("cpuprof", c)
        # data-loader workers sit on a few CPUs; the rest mostly idle
        base = r.choice((0.9, 0.85, 0.6)) if r.random() < 0.12 else r.uniform(0.01, 0.12)
        busy = [clamp(base * (0.35 + 0.7 * x) + r.gauss(0, 0.03), 0.0, 1.0) for x in job]
        cpu_cache[c] = busy
        return busy

    modes = ("idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user")

    def cpu_seconds(c, mode):
        def fn():
            r = ctx.rng("cpu", c, mode)
            busy = cpu_profile(c)
            ticks = r.randrange(10**3, 6 * 10**7) if mode == "idle" else r.randrange(0, 10**6)
            if mode in ("steal", "nice"):
                ticks = r.choice((0, 0, 37))
            out = []
            for u, d in zip(busy, ctx.dt):
                if mode == "idle":
                    frac = 1.0 - u
                elif mode == "user":
                    frac = u * 0.82
                elif mode == "system":
                    frac = u * 0.15
                elif mode == "softirq":
                    frac = u * 0.02
                elif mode == "irq":
                    frac = u * 0.004
                elif mode == "iowait":
                    frac = 0.002 if r.random() < 0.1 else 0.0
                else:
                    frac = 0.0
                # USER_HZ = 100: whole ticks, carried fraction randomised
                ticks += int(frac * d * 100 + r.random())
                out.append(go_g(ticks / 100.0))
            return out
        return fn

    for c in range(n_cpus):
        for mode in modes:
            b.add("node_cpu_seconds_total", "counter", "Seconds the CPUs spent in each mode.",
                  lbl(cpu=str(c), mode=mode), cpu_seconds(c, mode))
    for c in range(n_cpus):
        for mode in ("nice", "user"):
            b.add("node_cpu_guest_seconds_total", "counter", "Seconds the CPUs spent in guests (VMs) for each mode.",
                  lbl(cpu=str(c), mode=mode), lambda: ["0"] * T)
    freqs = (8.0e8, 1.5e9, 2.0e9, 2.6e9, 3.0e9, 3.8e9)
    for c in range(n_cpus):
        def freq(c=c):
            r = ctx.rng("freq", c)
            busy = cpu_profile(c)
            out, f = [], r.choice(freqs)
            for u in busy:
                if r.random() < 0.15:
                    f = r.choice(freqs[3:]) if u > 0.5 else r.choice(freqs)
                out.append(go_g(f))
            return out
        b.add("node_cpu_scaling_frequency_hertz", "gauge", "Current scaled CPU thread frequency in hertz.",
              lbl(cpu=str(c)), freq)
    for c in range(n_cpus):
        b.add("node_cpu_scaling_frequency_max_hertz", "gauge", "Maximum scaled CPU thread frequency in hertz.",
              lbl(cpu=str(c)), lambda: ["3.8e+09"] * T)
    for c in range(n_cpus):
        b.add("node_cpu_scaling_frequency_min_hertz", "gauge", "Minimum scaled CPU thread frequency in hertz.",
              lbl(cpu=str(c)), lambda: ["8e+08"] * T)

    def per_cpu_counter(tag, start, lo, hi, scale=1.0, p=1.0):
        def mk(c):
            def fn():
                r = ctx.rng(tag, c)
                busy = cpu_profile(c)
                v = r.randrange(*start)
                out = []
                for u, d in zip(busy, ctx.dt):
                    if r.random() < p:
                        v += int(d * r.uniform(lo, hi) * (0.05 + u))
                    out.append(go_g(v * scale) if scale != 1.0 else go_g(float(v)))
                return out
            return fn
        return mk

    for name, help_, mk in (
            ("node_softnet_processed_total", "Number of processed packets",
             per_cpu_counter("sn_proc", (10**5, 10**9), 10, 4000)),
            ("node_softnet_dropped_total", "Number of dropped packets",
             lambda c: (lambda: ["0"] * T)),
            ("node_softnet_times_squeezed_total", "Number of times processing packets ran out of quota",
             per_cpu_counter("sn_sq", (0, 5000), 1, 3, 1.0, 0.002)),
            ("node_schedstat_running_seconds_total", "Number of seconds CPU spent running a process.",
             per_cpu_counter("ss_run", (10**12, 6 * 10**14), 2e8, 1.0e9, 1e-9)),
            ("node_schedstat_waiting_seconds_total", "Number of seconds spent by processing waiting for this CPU.",
             per_cpu_counter("ss_wait", (10**11, 10**13), 1e6, 6e7, 1e-9)),
            ("node_schedstat_timeslices_total", "Number of timeslices executed by CPU.",
             per_cpu_counter("ss_ts", (10**7, 10**10), 50, 4000))):
        for c in range(n_cpus):
            b.add(name, "counter", help_, lbl(cpu=str(c)), mk(c))

    # ---------------- interrupts fill the rest
    rest = n_series - b.count()
    if rest > 0:
        irqs = []
        for i in range(0, 64):
            irqs.append(("mlx5_comp%d@pci:0000:%s:00.0" % (i % 32, PCI[i // 32 * 4]), str(100 + i)))
        for i in range(0, 64):
            irqs.append(("nvme%dq%d" % (i // 16, i % 16 + 1), str(200 + i)))
        for i, (dev, typ) in enumerate((("timer", "LOC"), ("Rescheduling interrupts", "RES"),
                                        ("Function call interrupts", "CAL"),
                                        ("TLB shootdowns", "TLB"))):
            irqs.insert(i, (dev, typ))
        k = 0
        for dev, typ in irqs:
            for c in range(n_cpus):
                if k >= rest:
                    break
                home = (int(typ) * 7) % n_cpus if typ.isdigit() else None

                def fn(c=c, dev=dev, typ=typ, home=home):
                    r = ctx.rng("irq", typ, c)
                    v = r.randrange(0, 10**4) if home not in (None, c) else r.randrange(10**4, 10**9)
                    out = []
                    busy = job
                    for x, d in zip(busy, ctx.dt):
                        if home is None:
                            v += int(d * r.uniform(20, 1100) * (0.2 + x))
                        elif home == c:
                            v += int(d * r.uniform(100, 9000) * (0.1 + x))
                        out.append(go_g(float(v)))
                    return out
                b.add("node_interrupts_total", "counter", "Interrupt details.",
                      lbl(cpu=str(c), devices=dev, type=typ), fn)
                k += 1
            if k >= rest:
                break
    return b, n_cpus


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--series", type=int, default=10000)
    ap.add_argument("--seconds", type=int, default=900)
    ap.add_argument("--step", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--start", type=int, default=1763719200,
                    help="unix seconds of the first scrape (default 2025-11-21T10:00:00Z, "
                         "aligned to a 2h Prometheus block boundary)")
    ap.add_argument("--cpus", type=int, default=224, help="logical CPUs (2 x 56 cores x 2 threads)")
    a = ap.parse_args()

    T = max(1, int(a.seconds / a.step))
    jr = random.Random("%d|ts" % a.seed)
    step_ms = int(round(a.step * 1000))
    ts_ms = []
    for i in range(T):
        j = int(round(clamp(jr.gauss(0, 2.0), -8, 8)))
        ts_ms.append(a.start * 1000 + 137 + i * step_ms + j)
    ctx = Ctx(a.seed, T, ts_ms)
    b, n_cpus = build(ctx, a.series, a.cpus)
    ts_s = [ms_to_om(t) for t in ts_ms]

    n = 0
    with open(a.out, "w", encoding="utf-8", newline="\n", buffering=1 << 20) as f:
        for name, mtype, help_, series in b.families:
            if n >= a.series:
                break
            # OpenMetrics: a counter family is named without the _total its samples carry
            fam = name[:-len("_total")] if mtype == "counter" and name.endswith("_total") else name
            f.write("# HELP %s %s\n# TYPE %s %s\n" % (fam, help_, fam, mtype))
            for labels, fn in series:
                if n >= a.series:
                    break
                vals = fn()
                assert len(vals) == T, name
                prefix = name + ("{" + labels + "}" if labels else "") + " "
                f.write("".join([prefix + v + " " + t + "\n" for v, t in zip(vals, ts_s)]))
                n += 1
        f.write("# EOF\n")
    print("gen_gpu_node: %d series x %d scrapes = %d samples, %d families, %d cpus -> %s"
          % (n, T, n * T, len(b.families), n_cpus, a.out), file=sys.stderr)


if __name__ == "__main__":
    main()
