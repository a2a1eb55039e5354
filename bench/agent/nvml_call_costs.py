#!/usr/bin/env python3
"""What single NVML calls cost the calling thread, on a real GPU.

`vtax doctor --gpu` times the agent's own reads. This asks the next question:
would another call give the same value for less? It times, on GPU 0, each call
the collector makes per tick beside the field-values form of the same value
(nvmlDeviceGetFieldValues), alone and batched, through the nvidia-ml-py
bindings (pynvml), so nothing needs building on the GPU machine.

Each call is repeated --repeats times after one warm-up; the medians of the
calling thread's CPU time and of wall time are printed in milliseconds.

Usage (on the GPU machine):
  python3 bench/agent/nvml_call_costs.py [--repeats 30] [--gap-seconds 1] [--only GPM,energy]
"""
import argparse
import statistics
import time

import pynvml as n


def timed(call, repeats, gap_seconds):
    call()  # warm-up: a first call may load or allocate
    cpu, wall = [], []
    for _ in range(repeats):
        time.sleep(gap_seconds)
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        call()
        cpu.append(time.thread_time_ns() - c0)
        wall.append(time.perf_counter_ns() - w0)
    return statistics.median(cpu) / 1e6, statistics.median(wall) / 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--gap-seconds", type=float, default=0.0,
                        help="sleep between calls, as between the agent's ticks")
    parser.add_argument("--only", default="", help="comma-separated substrings of the calls to time")
    parser.add_argument("--first-ticks", type=int, default=0,
                        help="first time this many GPM ticks of a fresh process, one by one, --gap-seconds apart")
    args = parser.parse_args()
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    print(f"GPU 0: {n.nvmlDeviceGetName(h)}, driver {n.nvmlSystemGetDriverVersion()}")

    def field(*ids):
        def read():
            values = n.nvmlDeviceGetFieldValues(h, list(ids))
            for v in values:
                if v.nvmlReturn != n.NVML_SUCCESS:
                    raise n.NVMLError(v.nvmlReturn)
            return values
        return read

    def gpm_pair(metrics):
        # The collector keeps the previous sample: per tick it takes one and
        # computes the metrics over the pair.
        samples = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
        n.nvmlGpmSampleGet(h, samples[0])
        state = {"i": 1}

        def tick():
            i = state["i"]
            n.nvmlGpmSampleGet(h, samples[i])
            state["i"] = 1 - i
            if not metrics:
                return
            get = n.c_nvmlGpmMetricsGet_t()
            get.version = n.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(metrics)
            get.sample1 = samples[1 - i]
            get.sample2 = samples[i]
            for k, metric in enumerate(metrics):
                get.metrics[k].metricId = metric
            n.nvmlGpmMetricsGet(get)
        return tick

    def gpm_fresh(metrics):
        # A new sample each tick, freed when the next tick has used it: what
        # a binding that allocates in its sample call does.
        state = {"previous": n.nvmlGpmSampleGet(h, n.nvmlGpmSampleAlloc())}

        def tick():
            now = n.nvmlGpmSampleGet(h, n.nvmlGpmSampleAlloc())
            get = n.c_nvmlGpmMetricsGet_t()
            get.version = n.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(metrics)
            get.sample1 = state["previous"]
            get.sample2 = now
            for k, metric in enumerate(metrics):
                get.metrics[k].metricId = metric
            n.nvmlGpmMetricsGet(get)
            n.nvmlGpmSampleFree(state["previous"])
            state["previous"] = now
        return tick

    # The collector's GPU-wide GPM metrics, then rx and tx of each of 18 links.
    gpu_wide = [n.NVML_GPM_METRIC_SM_UTIL, n.NVML_GPM_METRIC_SM_OCCUPANCY,
                n.NVML_GPM_METRIC_ANY_TENSOR_UTIL, n.NVML_GPM_METRIC_DRAM_BW_UTIL,
                n.NVML_GPM_METRIC_PCIE_RX_PER_SEC, n.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
                n.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, n.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC]
    per_link = [getattr(n, f"NVML_GPM_METRIC_NVLINK_L{link}_{way}_PER_SEC")
                for link in range(18) for way in ("RX", "TX")]

    if args.first_ticks:
        # Before any other GPM call of this process: does the first metrics
        # computation cost what later ones do?
        tick = gpm_pair(gpu_wide + per_link)
        for i in range(args.first_ticks):
            time.sleep(args.gap_seconds)
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            tick()
            print(f"GPM tick {i + 1} of a fresh process: CPU {(time.thread_time_ns() - c0) / 1e6:.3f} ms,"
                  f" wall {(time.perf_counter_ns() - w0) / 1e6:.3f} ms")

    def process_count():
        # The list's first half: the count alone, with no buffer. Whether it
        # costs less than the whole list says whether a tick could ask it
        # and list the processes only when it changes.
        count = n.c_uint(0)
        get = n._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
        ret = get(h, n.byref(count), None)
        if ret not in (n.NVML_SUCCESS, n.NVML_ERROR_INSUFFICIENT_SIZE):
            raise n.NVMLError(ret)
        return count.value

    calls = [
        ("total_energy_consumption", lambda: n.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("field 83 (total energy)", field(n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)),
        ("power_usage", lambda: n.nvmlDeviceGetPowerUsage(h)),
        ("field 186 (power, instant)", field(n.NVML_FI_DEV_POWER_INSTANT)),
        ("pcie_replay_counter", lambda: n.nvmlDeviceGetPcieReplayCounter(h)),
        ("field 94 (PCIe replays)", field(n.NVML_FI_DEV_PCIE_REPLAY_COUNTER)),
        ("mig_mode", lambda: n.nvmlDeviceGetMigMode(h)),
        ("field 82 (HBM temperature)", field(n.NVML_FI_DEV_MEMORY_TEMP)),
        ("fields 82+83+94 in one call", field(n.NVML_FI_DEV_MEMORY_TEMP,
                                              n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
                                              n.NVML_FI_DEV_PCIE_REPLAY_COUNTER)),
        ("utilization_rates", lambda: n.nvmlDeviceGetUtilizationRates(h)),
        ("temperature", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
        ("clock SM", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
        ("memory_info", lambda: n.nvmlDeviceGetMemoryInfo(h)),
        ("throttle reasons", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h)),
        ("running_compute_processes", lambda: n.nvmlDeviceGetComputeRunningProcesses(h)),
        ("running_compute_processes count", process_count),
        ("current_pcie_link_gen", lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        ("current_pcie_link_width", lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h)),
    ]
    try:
        calls.append(("GPM: sample, 8 GPU-wide", gpm_pair(gpu_wide)))
        calls.append(("GPM: sample, 8 + 36 per link", gpm_pair(gpu_wide + per_link)))
        calls.append(("GPM: sample only", gpm_pair([])))
        calls.append(("GPM: alloc, sample, 44, free", gpm_fresh(gpu_wide + per_link)))
        calls.append(("GPM: alloc + free only", lambda: n.nvmlGpmSampleFree(n.nvmlGpmSampleAlloc())))
    except n.NVMLError as e:
        print(f"GPM: {e}")

    print(f"{'call':<30} {'CPU ms':>8} {'wall ms':>8}   (medians of {args.repeats}, {args.gap_seconds} s apart)")
    only = [o for o in args.only.split(",") if o]
    for name, call in calls:
        if only and not any(o in name for o in only):
            continue
        try:
            cpu, wall = timed(call, args.repeats, args.gap_seconds)
            print(f"{name:<30} {cpu:>8.3f} {wall:>8.3f}")
        except n.NVMLError as e:
            print(f"{name:<30} {'-':>8} {'-':>8}   {e}")
    n.nvmlShutdown()


if __name__ == "__main__":
    main()
