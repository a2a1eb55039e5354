//! What each NVML read costs the calling thread on a real GPU, so that the
//! simulated backend can charge it (`collectors.gpu.simulate_nvml_costs`) and
//! a bench on a machine without a GPU measures what the collector's choice
//! of reads costs a GPU node (`bench/agent/gpu_driver_costs.py`).
//!
//! The figures are medians of the calling thread's CPU time on an H100 80GB
//! HBM3 (driver 580.159.04), from docs/gpus.md:
//! - idle: the doctor's third read on 2026-11-26 ("H100 80GB HBM3,
//!   2026-11-26: what single NVML calls cost", the agent built from 9c9e796:
//!   energy 3.27, `mig_mode` 0.47, PCIe replays 0.38, NVLink 0.12, the other
//!   17 reads 0.21 together), GPM from that section's table (idle, 1 s
//!   apart: the sample and the collector's 8 GPU-wide metrics 0.30-0.36 ms,
//!   with the 36 per-link metrics of 18 links up 0.43-0.45), split into the
//!   GPU-wide part and a part for each link up ([`GPM_LINK_PAIR`]), as the
//!   backend asks only for the rates of links that are up;
//! - busy: the doctor beside a device-to-device copy ("What each read
//!   costs", the table's run 4 column: energy 4.72, process shares 5.77,
//!   PCIe replays 1.10, `mig_mode` 0.55, the other reads 0.48 together); GPM
//!   there carried its one-time setup, so the busy figure is the upper end of
//!   what a running agent pays once it is set up (0.2-0.5 ms, same section).
//! - the process list 0.02 (idle) to 0.1 ms (busy) and the power reading
//!   0.003 ms come from the "Choices" and the 2026-11-26 table.
//!
//! Reads whose cost is given only as part of a group ("the other reads") are
//! charged the group's figure divided evenly among them. The MIG instance
//! reads were never timed (MIG was not turned on on a lent machine): they
//! are charged as the small reads are.

/// One NVML read: its name as the NVML backend's doctor timing names it,
/// and its CPU cost on an idle GPU and on a busy one, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallCost {
    /// The read, as `vtax doctor --gpu` lists it.
    pub read: &'static str,
    /// Calling thread's CPU on an idle GPU.
    pub idle_ms: f64,
    /// Calling thread's CPU with work on the GPU.
    pub busy_ms: f64,
}

/// GPM's sample and GPU-wide metrics: the middle of 0.30-0.36 ms idle;
/// busy, 0.50 ms (8 + 36 metrics) scaled by 0.33 / 0.44.
const GPM_GPU_WIDE_IDLE_MS: f64 = 0.33;
const GPM_GPU_WIDE_BUSY_MS: f64 = 0.50 * 0.33 / 0.44;

/// What each link up adds to GPM's read: its rx and tx metrics. Charged
/// once a tick for each link GPM is asked about; not a read of its own in
/// the NVML backend's doctor timing, which includes it in GPM's.
pub const GPM_LINK_PAIR: &str = "gpm per-link rx, tx (each link up)";

/// The small reads that are not listed apart, of the 15 the doctor timed
/// in a group: 0.21 ms together idle,
/// less the list and the power reading (0.187 ms), and 0.48 ms busy less
/// the same two and the NVLink reads (0.257 ms).
const SMALL_IDLE_MS: f64 = 0.187 / 15.0;
const SMALL_BUSY_MS: f64 = 0.257 / 15.0;

const fn small(read: &'static str) -> CallCost {
    CallCost {
        read,
        idle_ms: SMALL_IDLE_MS,
        busy_ms: SMALL_BUSY_MS,
    }
}

const fn call(read: &'static str, idle_ms: f64, busy_ms: f64) -> CallCost {
    CallCost {
        read,
        idle_ms,
        busy_ms,
    }
}

/// Every read the NVML backend makes of a Hopper GPU with GPM on.
pub static NVML_CALL_COSTS: &[CallCost] = &[
    call("total_energy_consumption", 3.27, 4.72),
    // Idle: the 2026-11-22 doctor with GPM off (the shares with the list).
    call("process_utilization_stats", 2.73, 5.77),
    // The sample and the 8 GPU-wide metrics; busy, the 0.50 of 8 + 36
    // metrics in the same proportion.
    call("gpm_sample, gpm_metrics_get", GPM_GPU_WIDE_IDLE_MS, GPM_GPU_WIDE_BUSY_MS),
    call(
        GPM_LINK_PAIR,
        (0.44 - GPM_GPU_WIDE_IDLE_MS) / 18.0,
        (0.50 - GPM_GPU_WIDE_BUSY_MS) / 18.0,
    ),
    call("pcie_replay_counter", 0.38, 1.10),
    call("mig_mode", 0.47, 0.55),
    // Timed in a VM whose hypervisor hides the links: one failing call per
    // link. With links up the error counters add three calls a link.
    call("nvlink is_active, error_counter", 0.12, 0.12),
    call("running_compute_processes", 0.02, 0.10),
    // Not timed on a GPU yet: taken to cost what the compute list does. Read
    // only while a listed process may be an MPS server.
    call("mps_compute_processes", 0.02, 0.10),
    call("power_usage", 0.003, 0.003),
    small("device_by_index"),
    small("memory_info"),
    small("utilization_rates"),
    small("remapped_rows"),
    small("field_values(memory temperature)"),
    small("clock_info(sm)"),
    small("clock_info(memory)"),
    small("current_throttle_reasons"),
    small("enforced_power_limit"),
    small("temperature"),
    small("total_ecc_errors(corrected)"),
    small("total_ecc_errors(uncorrected)"),
    // Timed apart only on an H200, a second apart as a tick makes them
    // ("H200, 2026-11-27: the collector's cost read by read": idle, and
    // beside a copy); the H100's doctor timed them among its small reads,
    // back to back, where they cost less.
    call("current_pcie_link_gen", 0.054, 0.049),
    call("current_pcie_link_width", 0.176, 0.180),
    small("virtualization_mode"),
    small("mig instances"),
];

/// The reads of every tick's sample of a GPU that answers, as the NVML
/// backend makes them: all but the slow reads ([`SLOW`]) and the two dear
/// ones the collector spaces out on their own cadences.
pub const EVERY_TICK: &[&str] = &[
    "device_by_index",
    "memory_info",
    "utilization_rates",
    "gpm_sample, gpm_metrics_get",
    "field_values(memory temperature)",
    "running_compute_processes",
    "clock_info(sm)",
    "clock_info(memory)",
    "current_throttle_reasons",
    "power_usage",
    "temperature",
    "current_pcie_link_gen",
    "current_pcie_link_width",
];

/// The reads of [`EVERY_TICK`] that a quiet GPU makes only every
/// `slow_reads_interval_secs` (see `backend::is_quiet`).
pub const QUIET_SKIPS: &[&str] = &[
    "gpm_sample, gpm_metrics_get",
    "current_pcie_link_gen",
    "current_pcie_link_width",
];

/// The PCIe link reads that a GPU under load holds while its last read found
/// the link at its maximum (`ReadPlan::hold_loaded_link`).
pub const PCIE_LINK_READS: &[&str] = &["current_pcie_link_gen", "current_pcie_link_width"];

/// The reads of the values that change rarely or are counters read for
/// their increase, made every `slow_reads_interval_secs`.
pub const SLOW: &[&str] = &[
    "remapped_rows",
    "nvlink is_active, error_counter",
    "mig_mode",
    "enforced_power_limit",
    "total_ecc_errors(corrected)",
    "total_ecc_errors(uncorrected)",
    "pcie_replay_counter",
    "virtualization_mode",
];

/// The reads a lost GPU costs: the handle, then the first read that fails.
pub const LOST: &[&str] = &["device_by_index", "memory_info"];

/// CPU seconds that `reads` cost on a busy or an idle GPU; a read the table
/// lacks costs nothing (a test keeps the table whole).
pub fn seconds_of(reads: &[&str], busy: bool) -> f64 {
    reads
        .iter()
        .filter_map(|read| NVML_CALL_COSTS.iter().find(|c| c.read == *read))
        .map(|c| if busy { c.busy_ms } else { c.idle_ms })
        .sum::<f64>()
        / 1e3
}

/// Spins the calling thread until it has spent `seconds` of CPU: a driver
/// call spends its time on the CPU (docs/gpus.md: wall = CPU for every read
/// but NVML's own PCIe throughput), and counting the thread's CPU rather
/// than the clock charges the same on a loaded machine.
pub fn spend_cpu(seconds: f64) {
    let thread_cpu_ns = crate::jitter::thread_cpu_ns;
    let end = thread_cpu_ns().saturating_add((seconds * 1e9) as u64);
    while thread_cpu_ns() < end {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_read_charged_is_in_the_table() {
        for read in EVERY_TICK.iter().chain(SLOW).chain(LOST).chain(&[
            GPM_LINK_PAIR,
            "total_energy_consumption",
            "process_utilization_stats",
            "mig instances",
        ]) {
            assert!(
                NVML_CALL_COSTS.iter().any(|c| c.read == *read),
                "{read} has no cost"
            );
        }
    }

    /// The table adds up to what the doctor measured per tick: 4.66 ms on
    /// an idle H100 (2026-11-26), 18 links up, with GPM and the PCIe link
    /// at their 1 s-apart figures (GPM 0.44 in place of the doctor's 0.21,
    /// the link 0.23 on an H200 in place of two small reads).
    #[test]
    fn an_idle_tick_costs_what_the_doctor_measured() {
        let with_energy: Vec<&str> = EVERY_TICK
            .iter()
            .chain(SLOW)
            .copied()
            .chain(["total_energy_consumption"])
            .chain([GPM_LINK_PAIR; 18])
            .collect();
        let idle_ms = seconds_of(&with_energy, false) * 1e3;
        let link_ms = 0.054 + 0.176 - 2.0 * SMALL_IDLE_MS;
        assert!(
            (idle_ms - (4.66 - 0.21 + 0.44 + link_ms)).abs() < 1e-9,
            "{idle_ms}"
        );
        assert!(seconds_of(&with_energy, true) > seconds_of(&with_energy, false));
        // With the links hidden GPM costs its GPU-wide part alone.
        let gpm = ["gpm_sample, gpm_metrics_get"];
        assert!((seconds_of(&gpm, false) * 1e3 - 0.33).abs() < 1e-9);
    }

    #[test]
    fn spending_cpu_spends_at_least_that_much() {
        let before = crate::jitter::thread_cpu_ns();
        spend_cpu(0.002);
        assert!(crate::jitter::thread_cpu_ns() - before >= 2_000_000);
    }
}
