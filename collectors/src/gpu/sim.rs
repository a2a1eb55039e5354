//! The simulated GPU backend: N GPUs of an H100 or H200 profile, each playing a
//! scenario (training, a throttle, a link trained down, NVLink hidden, an XID,
//! a GPU lost, HBM running slow). Chosen only explicitly (`--simulate-gpus N` or
//! `collectors.gpu.simulate_gpus`); it drives the tests, the dashboards' checks
//! and demos on machines without a GPU.
//!
//! Values are a pure function of the GPU, its scenario and the seconds since
//! the first sample, so a test or a golden file sees the same numbers every
//! run, and counters grow as the real ones do: the energy counter is the
//! exact integral of the power drawn.
//!
//! Each sample makes the reads its [`ReadPlan`] asks for, as the NVML
//! backend does, and counts them by the NVML backend's names
//! ([`SimBackend::read_counts`]). With `charge_nvml_costs`, it also spins the
//! calling thread for the CPU those reads cost on an H100 (`costs.rs`), for
//! benches; never otherwise.

use std::collections::BTreeMap;
use std::f64::consts::TAU;
use std::path::PathBuf;
use std::time::SystemTime;
use std::sync::{Arc, Mutex};

use super::backend::{
    is_quiet, nvlink_link_bytes_per_second_each_way, GpmMetrics, GpuBackend, GpuIdentity,
    GpuSample, LinkSample, MigSample, ProcessSample, ReadPlan, SampleError, VirtualizationMode,
    XidEvent,
};
use super::costs;

/// A GPU model the simulator imitates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Profile {
    /// Config name.
    pub key: &'static str,
    /// The name NVML gives it.
    pub name: &'static str,
    memory_bus_width_bits: u32,
    memory_clock_max_mhz: f64,
    sm_clock_max_mhz: f64,
    memory_total_bytes: u64,
    power_limit_watts: f64,
}

/// The profiles `simulate_profile` takes.
pub const PROFILES: &[Profile] = &[
    Profile {
        key: "h100",
        name: "NVIDIA H100 80GB HBM3",
        memory_bus_width_bits: 5120,
        memory_clock_max_mhz: 2619.0,
        sm_clock_max_mhz: 1980.0,
        memory_total_bytes: 81_559 * MIB,
        power_limit_watts: 700.0,
    },
    Profile {
        key: "h200",
        name: "NVIDIA H200",
        // What NVML reports on a real H200 (docs/gpus.md): 6016 bits, not
        // six stacks × 1024; with 3201 MHz that gives the 4.8 TB/s NVIDIA quotes.
        memory_bus_width_bits: 6016,
        memory_clock_max_mhz: 3201.0,
        sm_clock_max_mhz: 1980.0,
        memory_total_bytes: 143_771 * MIB,
        power_limit_watts: 700.0,
    },
];

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const NVLINK_LINKS: u32 = 18;

/// What a simulated GPU is doing; [`Scenario::help`] says what each one plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Idle,
    Training,
    MemoryBound,
    ThermalThrottle,
    PowerThrottle,
    PcieDegraded,
    NvlinkHidden,
    HbmDegraded,
    Xid,
    Lost,
    Mig,
}

/// Every scenario with its config name.
pub const SCENARIOS: &[(&str, Scenario)] = &[
    ("idle", Scenario::Idle),
    ("training", Scenario::Training),
    ("memory-bound", Scenario::MemoryBound),
    ("thermal-throttle", Scenario::ThermalThrottle),
    ("power-throttle", Scenario::PowerThrottle),
    ("pcie-degraded", Scenario::PcieDegraded),
    ("nvlink-hidden", Scenario::NvlinkHidden),
    ("hbm-degraded", Scenario::HbmDegraded),
    ("xid", Scenario::Xid),
    ("gpu-lost", Scenario::Lost),
    ("mig", Scenario::Mig),
];

impl Scenario {
    /// What the scenario plays, in one line, for `--help`.
    pub fn help(self) -> &'static str {
        match self {
            Scenario::Idle => "nothing running: clocks down, the idle reason set",
            Scenario::Training => "a healthy training step loop: tensor-heavy, NVLink busy",
            Scenario::MemoryBound => "bandwidth-bound kernels: HBM near its peak, SMs waiting",
            Scenario::ThermalThrottle => {
                "too hot: thermal slowdown reasons set, SM clock held down"
            }
            Scenario::PowerThrottle => {
                "at the power cap: the power-cap reason set, SM clock held down"
            }
            Scenario::PcieDegraded => {
                "the PCIe link trained down to Gen3 x8 under load, replays counting"
            }
            Scenario::NvlinkHidden => {
                "a VM with the GPU passed through and NVLink hidden: no link up"
            }
            Scenario::HbmDegraded => {
                "HBM held at about half its clock: bytes/s about half a healthy step's"
            }
            Scenario::Xid => "XID errors: 31 at the first tick, 13 every minute after",
            Scenario::Lost => "fell off the bus: XID 79 once, then no sample at all",
            Scenario::Mig => "MIG on: three GPU instances with a process in each",
        }
    }

    /// Parses a config name.
    pub fn parse(name: &str) -> Option<Scenario> {
        SCENARIOS.iter().find(|(k, _)| *k == name).map(|(_, s)| *s)
    }
}

/// Looks a profile up by its config name.
pub fn profile(key: &str) -> Option<Profile> {
    PROFILES.iter().find(|p| p.key == key).copied()
}

/// Reason bits, as NVML numbers them.
const REASON_GPU_IDLE: u64 = 0x1;
const REASON_SW_POWER_CAP: u64 = 0x4;
const REASON_SW_THERMAL: u64 = 0x20;
const REASON_HW_THERMAL: u64 = 0x40;

/// N simulated GPUs.
pub struct SimBackend {
    profile: Profile,
    scenarios: Vec<Scenario>,
    first_time_us: Option<i64>,
    pending_xids: Vec<XidEvent>,
    /// Seconds (since the first sample) up to which XIDs were emitted, per GPU.
    xid_emitted_until: Vec<Option<i64>>,
    /// Whether each sample spends the CPU its NVML reads would.
    charge_nvml_costs: bool,
    /// The reads made so far, by the NVML backend's name of each.
    read_counts: ReadCounts,
    /// Scenarios a GPU turns to later: (GPU, seconds since the first
    /// sample, scenario), for tests of a value that changes.
    turns: Vec<(u32, f64, Scenario)>,
    /// Where the scenarios of a running agent's GPUs are changed.
    scenarios_file: Option<ScenariosFile>,
    /// Per GPU: the scenario of its last sample, and what its energy counter
    /// carries over the changes of scenario before, so that the counter
    /// goes on from where the last scenario left it (as a real GPU's does
    /// when its work changes) rather than jump to the new scenario's curve.
    energy_carried: Vec<Option<(Scenario, f64)>>,
}

/// `simulate_scenarios_file`: GPU i plays the i-th scenario it names (in
/// turn), read again whenever the file changes, so that a demo or the fleet
/// evaluation (bench/fleet/evaluate.py) degrades and restores a GPU of an
/// agent that keeps running, as a real fault comes and goes.
struct ScenariosFile {
    path: PathBuf,
    /// Modification time and length last acted on; None where the file
    /// could not be looked at.
    seen: Option<Option<(SystemTime, u64)>>,
    checked_at_us: Option<i64>,
}

/// How often the scenarios file is looked at: a change takes effect within
/// this and a tick.
const SCENARIOS_FILE_CHECK_US: i64 = 500_000;

/// Scenario names separated by commas, spaces or lines.
pub fn parse_scenario_list(text: &str) -> Result<Vec<Scenario>, String> {
    let scenarios = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|name| !name.is_empty())
        .map(|name| {
            Scenario::parse(name).ok_or_else(|| {
                let known: Vec<&str> = SCENARIOS.iter().map(|(k, _)| *k).collect();
                format!("{name:?} is not a scenario (one of {})", known.join(", "))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if scenarios.is_empty() {
        return Err("names no scenario".into());
    }
    Ok(scenarios)
}

/// How many times each read was made, by the NVML backend's name of it
/// (`costs::NVML_CALL_COSTS`), over every GPU.
pub type ReadCounts = Arc<Mutex<BTreeMap<&'static str, u64>>>;

impl SimBackend {
    /// `count` GPUs of `profile`; GPU i plays `scenarios[i % len]`.
    pub fn new(count: u32, profile: Profile, scenarios: Vec<Scenario>) -> SimBackend {
        let scenarios = if scenarios.is_empty() {
            vec![Scenario::Training]
        } else {
            scenarios
        };
        let scenarios = (0..count as usize)
            .map(|i| scenarios[i % scenarios.len()])
            .collect::<Vec<_>>();
        SimBackend {
            profile,
            xid_emitted_until: vec![None; scenarios.len()],
            energy_carried: vec![None; scenarios.len()],
            scenarios,
            first_time_us: None,
            pending_xids: Vec::new(),
            charge_nvml_costs: false,
            read_counts: ReadCounts::default(),
            turns: Vec::new(),
            scenarios_file: None,
        }
    }

    /// GPU i plays the i-th scenario `path` names (in turn), read at the
    /// first sample and again whenever the file changes; until it can be
    /// read, and while it names something that is not a scenario, the
    /// scenarios in force stay.
    pub fn with_scenarios_file(mut self, path: PathBuf) -> SimBackend {
        self.scenarios_file = Some(ScenariosFile {
            path,
            seen: None,
            checked_at_us: None,
        });
        self
    }

    /// Acts on a change of the scenarios file, looking at most every
    /// [`SCENARIOS_FILE_CHECK_US`].
    fn refresh_scenarios(&mut self, time_us: i64) {
        let Some(file) = self.scenarios_file.as_mut() else {
            return;
        };
        if file
            .checked_at_us
            .is_some_and(|at| (time_us - at).abs() < SCENARIOS_FILE_CHECK_US)
        {
            return;
        }
        file.checked_at_us = Some(time_us);
        let stamp = std::fs::metadata(&file.path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())));
        if file.seen == Some(stamp) {
            return;
        }
        file.seen = Some(stamp);
        let path = file.path.display().to_string();
        let read = std::fs::read_to_string(&file.path)
            .map_err(|e| format!("cannot read it: {e}"))
            .and_then(|text| parse_scenario_list(&text));
        match read {
            Ok(list) => {
                let count = self.scenarios.len();
                self.scenarios = (0..count).map(|i| list[i % list.len()]).collect();
                tracing::info!(file = %path, scenarios = ?self.scenarios, "Simulated GPUs play the scenarios file.");
            }
            Err(why) => {
                tracing::warn!(file = %path, reason = %why, "Scenarios file not used; the simulated GPUs play on as they were.");
            }
        }
    }

    /// The reads this backend has made, shared: it goes on counting.
    #[cfg(test)]
    pub fn read_counts(&self) -> ReadCounts {
        Arc::clone(&self.read_counts)
    }

    /// GPU `gpu` plays `to` from `at_seconds` after the first sample on.
    #[cfg(test)]
    pub fn turning(mut self, gpu: u32, at_seconds: f64, to: Scenario) -> SimBackend {
        self.turns.push((gpu, at_seconds, to));
        self
    }

    /// The scenario GPU `index` plays `seconds` after the first sample.
    fn scenario_at(&self, index: u32, seconds: f64) -> Option<Scenario> {
        let scenario = *self.scenarios.get(index as usize)?;
        Some(
            self.turns
                .iter()
                .filter(|(gpu, at, _)| *gpu == index && seconds >= *at)
                .map(|(_, _, to)| *to)
                .next_back()
                .unwrap_or(scenario),
        )
    }

    /// Counts `reads`, and spends their CPU when charging costs.
    fn make_reads(&mut self, reads: &[&'static str], busy: bool) {
        {
            let mut counts = self.read_counts.lock().expect("not poisoned");
            for read in reads {
                *counts.entry(read).or_default() += 1;
            }
        }
        if self.charge_nvml_costs {
            costs::spend_cpu(costs::seconds_of(reads, busy));
        }
    }

    /// Makes each sample spend the CPU that the NVML backend's reads of it
    /// cost on an H100 (`costs::NVML_CALL_COSTS`): for benches.
    pub fn charging_nvml_costs(mut self, charge: bool) -> SimBackend {
        self.charge_nvml_costs = charge;
        self
    }

    fn uuid(index: u32) -> String {
        format!("GPU-5a1e0000-0000-4000-8000-{index:012x}")
    }

    /// XIDs a scenario raises between the last emitted second and `seconds`.
    fn emit_xids(&mut self, index: u32, seconds: i64, time_us: i64) {
        let scenario = self.scenarios[index as usize];
        let done = self.xid_emitted_until[index as usize];
        let mut emit = |xid| {
            self.pending_xids.push(XidEvent {
                uuid: Self::uuid(index),
                xid,
                time_us,
            })
        };
        match scenario {
            Scenario::Xid => {
                if done.is_none() {
                    emit(31);
                }
                let from = done.map_or(1, |d| d + 1);
                for s in from.max(1)..=seconds {
                    if s % 60 == 0 {
                        emit(13);
                    }
                }
            }
            Scenario::Lost if done.is_none() => emit(79),
            _ => {}
        }
        self.xid_emitted_until[index as usize] = Some(seconds);
    }
}

/// The wobble's period.
pub const WOBBLE_PERIOD_SECONDS: f64 = 60.0;

/// A slow, GPU-specific wobble in [-1, 1], so graphs of a demo move.
fn wobble(index: u32, seconds: f64) -> f64 {
    (TAU * seconds / WOBBLE_PERIOD_SECONDS + f64::from(index)).sin()
}

impl GpuBackend for SimBackend {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn driver_version(&self) -> String {
        "simulated".into()
    }

    fn identities(&mut self) -> Result<Vec<GpuIdentity>, String> {
        let p = self.profile;
        Ok((0..self.scenarios.len() as u32)
            .map(|index| GpuIdentity {
                index,
                uuid: Self::uuid(index),
                name: p.name.into(),
                pci_bus_id: format!("00000000:{:02x}:00.0", 0x18 + index * 0x10),
                architecture: "hopper".into(),
                memory_bus_width_bits: Some(p.memory_bus_width_bits),
                memory_clock_max_hz: Some(p.memory_clock_max_mhz * 1e6),
                sm_clock_max_hz: Some(p.sm_clock_max_mhz * 1e6),
                pcie_link_gen_max: Some(5),
                pcie_link_width_max: Some(16),
                nvlink_links_product: Some(NVLINK_LINKS),
                gpm_supported: true,
            })
            .collect())
    }

    fn sample(
        &mut self,
        gpu: &GpuIdentity,
        time_us: i64,
        plan: ReadPlan,
    ) -> Result<GpuSample, SampleError> {
        self.refresh_scenarios(time_us);
        let first = *self.first_time_us.get_or_insert(time_us);
        let elapsed_us = (time_us - first).max(0);
        let seconds = elapsed_us as f64 / 1e6;
        let index = gpu.index;
        let scenario = self
            .scenario_at(index, seconds)
            .ok_or_else(|| SampleError::Lost(format!("no simulated GPU {index}")))?;
        self.emit_xids(index, elapsed_us / 1_000_000, time_us);
        if scenario == Scenario::Lost {
            self.make_reads(costs::LOST, false);
            return Err(SampleError::Lost(
                "GPU has fallen off the bus (simulated XID 79)".into(),
            ));
        }
        let mut sample = simulate(&self.profile, gpu, scenario, seconds);
        let at = index as usize;
        let carried = match self.energy_carried[at] {
            Some((before, carried)) if before != scenario => {
                carried + energy_joules(&self.profile, index, before, seconds)
                    - energy_joules(&self.profile, index, scenario, seconds)
            }
            Some((_, carried)) => carried,
            None => 0.0,
        };
        self.energy_carried[at] = Some((scenario, carried));
        sample.energy_joules = sample.energy_joules.map(|e| e + carried);
        let mut reads = costs::EVERY_TICK.to_vec();
        if plan.slow {
            reads.extend(costs::SLOW);
        } else {
            // As the NVML backend: not read, so None (the collector carries
            // the last), and MIG as the plan carries it.
            sample.power_limit_watts = None;
            sample.ecc_corrected_errors = None;
            sample.ecc_uncorrected_errors = None;
            sample.remapped_rows_correctable = None;
            sample.remapped_rows_uncorrectable = None;
            sample.remapping_pending = None;
            sample.remapping_failed = None;
            sample.pcie_replays = None;
            sample.virtualization_mode = None;
            sample.links.clear();
        }
        let mig_enabled = plan.mig_mode(sample.mig_enabled);
        sample.mig_enabled = plan.slow.then_some(sample.mig_enabled).flatten();
        if mig_enabled != Some(true) {
            sample.mig.clear();
        }
        sample.process_shares_read = plan
            .process_shares
            .calls_the_driver(sample.processes.len(), mig_enabled);
        if !sample.process_shares_read {
            for p in &mut sample.processes {
                p.sm_utilization_ratio = None;
                p.memory_utilization_ratio = None;
            }
        }
        if sample.process_shares_read {
            reads.push("process_utilization_stats");
        }
        if mig_enabled == Some(true) {
            reads.push("mig instances");
        }
        // As the NVML backend: a quiet GPU whose quiet reads the plan lets
        // go skips GPM, the PCIe throughput and the PCIe link.
        sample.quiet = is_quiet(
            sample.utilization_gpu_ratio,
            Some(sample.processes.len()),
            mig_enabled,
        );
        if plan.reads_energy(sample.quiet) {
            reads.push("total_energy_consumption");
        } else {
            sample.energy_joules = None;
        }
        if plan.skip_quiet_reads && sample.quiet {
            sample.gpm = None;
            sample.link_rates.clear();
            sample.pcie_rx_bytes_per_second = None;
            sample.pcie_tx_bytes_per_second = None;
            sample.pcie_link_gen = None;
            sample.pcie_link_width = None;
            reads.retain(|read| !costs::QUIET_SKIPS.contains(read));
        }
        if plan.holds_loaded_link(sample.utilization_gpu_ratio) {
            sample.pcie_link_gen = None;
            sample.pcie_link_width = None;
            reads.retain(|read| !costs::PCIE_LINK_READS.contains(read));
        }
        // GPM is asked for the rates of the links up, as the NVML backend asks.
        let links_asked = sample.link_rates.iter().filter(|r| r.0.is_some()).count();
        reads.extend(std::iter::repeat_n(costs::GPM_LINK_PAIR, links_asked));
        self.make_reads(&reads, scenario != Scenario::Idle);
        Ok(sample)
    }

    fn take_xids(&mut self) -> Vec<XidEvent> {
        std::mem::take(&mut self.pending_xids)
    }
}

/// Load levels of a scenario: (SM activity, tensor activity, DRAM bandwidth ratio, NVLink ratio).
fn load(scenario: Scenario) -> (f64, f64, f64, f64) {
    match scenario {
        Scenario::Idle => (0.0, 0.0, 0.0, 0.0),
        Scenario::MemoryBound => (0.62, 0.08, 0.92, 0.10),
        Scenario::NvlinkHidden => (0.80, 0.55, 0.50, 0.0),
        Scenario::ThermalThrottle | Scenario::PowerThrottle => (0.78, 0.50, 0.45, 0.55),
        Scenario::Mig => (0.55, 0.30, 0.35, 0.0),
        Scenario::HbmDegraded => (0.86, 0.62, 0.30, 0.60),
        _ => (0.86, 0.62, 0.55, 0.60),
    }
}

fn simulate(p: &Profile, gpu: &GpuIdentity, scenario: Scenario, seconds: f64) -> GpuSample {
    let index = gpu.index;
    let w = wobble(index, seconds);
    let (sm, tensor, dram, nvlink) = load(scenario);
    let busy = scenario != Scenario::Idle;
    let jiggle = |x: f64| (x * (1.0 + 0.03 * w)).clamp(0.0, 1.0);
    let (sm_clock_mhz, reasons, temperature) = match scenario {
        Scenario::Idle => (345.0, REASON_GPU_IDLE, 31.0),
        Scenario::ThermalThrottle => (1410.0, REASON_SW_THERMAL | REASON_HW_THERMAL, 88.0 + w),
        Scenario::PowerThrottle => (1650.0, REASON_SW_POWER_CAP, 71.0),
        Scenario::MemoryBound => (p.sm_clock_max_mhz, 0, 64.0 + w),
        _ => (p.sm_clock_max_mhz, 0, 67.0 + w),
    };
    let (power_base, power_swing) = power_curve(p, scenario);
    let power = power_base + power_swing * w;
    let (pcie_gen, pcie_width) = if scenario == Scenario::PcieDegraded {
        (3, 8)
    } else if busy {
        (5, 16)
    } else {
        // Idle links train down to save power; that is not a fault.
        (1, 16)
    };
    let pcie_rx = if busy { 2.1e9 * (1.0 + 0.1 * w) } else { 1e6 };
    let pcie_tx = if busy { 1.4e9 * (1.0 + 0.1 * w) } else { 1e6 };
    let hidden = scenario == Scenario::NvlinkHidden;
    let links: Vec<LinkSample> = (0..NVLINK_LINKS)
        .map(|link| {
            let rate = (!hidden).then(|| {
                jiggle(nvlink)
                    * nvlink_link_bytes_per_second_each_way("hopper").expect("a known generation")
                    * (1.0 + 0.01 * f64::from(link % 3))
            });
            LinkSample {
                link,
                active: !hidden,
                rx_bytes_per_second: rate,
                tx_bytes_per_second: rate.map(|r| r * 0.98),
                crc_errors: (!hidden).then_some(0),
                replay_errors: (!hidden).then_some(0),
                recovery_errors: (!hidden).then_some(0),
            }
        })
        .collect();
    let nvlink_total = |tx: bool| -> Option<f64> {
        (!hidden).then(|| {
            links
                .iter()
                .filter_map(|l| {
                    if tx {
                        l.tx_bytes_per_second
                    } else {
                        l.rx_bytes_per_second
                    }
                })
                .sum()
        })
    };
    let memory_used = match scenario {
        Scenario::Idle => GIB / 2,
        Scenario::Mig => 40 * GIB,
        _ => 72 * GIB + (index as u64) * 256 * MIB,
    };
    let pid = 41_000 + index * 10;
    let mig = if scenario == Scenario::Mig {
        [
            (1, "3g.40gb", 40u64),
            (5, "2g.20gb", 20),
            (13, "1g.10gb", 10),
        ]
        .iter()
        .enumerate()
        .map(|(i, &(instance, profile, gib))| MigSample {
            gpu_instance: Some(instance),
            uuid: format!("MIG-5a1e{index:04x}-0000-4000-8000-{instance:012x}"),
            profile: profile.into(),
            memory_used_bytes: Some(gib * GIB * 3 / 4),
            memory_total_bytes: Some(gib * GIB),
            sm_active_ratio: Some(jiggle(0.9 - 0.2 * i as f64)),
        })
        .collect()
    } else {
        Vec::new()
    };
    let processes = match scenario {
        Scenario::Idle => Vec::new(),
        Scenario::Mig => mig
            .iter()
            .enumerate()
            .map(|(i, m)| ProcessSample {
                pid: pid + i as u32,
                used_memory_bytes: m.memory_used_bytes,
                sm_utilization_ratio: m.sm_active_ratio,
                memory_utilization_ratio: Some(0.3),
                gpu_instance: m.gpu_instance,
            })
            .collect(),
        _ => vec![ProcessSample {
            pid,
            used_memory_bytes: Some(memory_used - GIB / 2),
            sm_utilization_ratio: Some(jiggle(0.95)),
            memory_utilization_ratio: Some(jiggle(dram * 0.9)),
            gpu_instance: None,
        }],
    };
    let energy = energy_joules(p, index, scenario, seconds);
    GpuSample {
        utilization_gpu_ratio: Some(if busy { jiggle(0.97) } else { 0.0 }),
        utilization_memory_ratio: Some(jiggle(dram * 0.85)),
        gpm: Some(GpmMetrics {
            sm_active_ratio: Some(jiggle(sm)),
            sm_occupancy_ratio: Some(jiggle(sm * 0.5)),
            tensor_active_ratio: Some(jiggle(tensor)),
            dram_bandwidth_ratio: Some(jiggle(dram)),
            pcie_rx_bytes_per_second: Some(pcie_rx),
            pcie_tx_bytes_per_second: Some(pcie_tx),
            nvlink_rx_bytes_per_second: nvlink_total(false),
            nvlink_tx_bytes_per_second: nvlink_total(true),
        }),
        sm_clock_hz: Some(sm_clock_mhz * 1e6),
        memory_clock_hz: Some(if scenario == Scenario::HbmDegraded {
            p.memory_clock_max_mhz * 0.55e6
        } else {
            p.memory_clock_max_mhz * 1e6
        }),
        clock_event_reasons: Some(reasons),
        power_watts: Some(power),
        power_limit_watts: Some(p.power_limit_watts),
        energy_joules: Some(energy),
        temperature_celsius: Some(temperature),
        memory_temperature_celsius: Some(temperature + 6.0),
        memory_used_bytes: Some(memory_used),
        memory_total_bytes: Some(p.memory_total_bytes),
        ecc_corrected_errors: Some(if scenario == Scenario::Xid {
            (seconds / 10.0).floor() as u64
        } else {
            0
        }),
        ecc_uncorrected_errors: Some(0),
        remapped_rows_correctable: Some(0),
        remapped_rows_uncorrectable: Some(0),
        remapping_pending: Some(false),
        remapping_failed: Some(false),
        pcie_rx_bytes_per_second: Some(pcie_rx),
        pcie_tx_bytes_per_second: Some(pcie_tx),
        pcie_link_gen: Some(pcie_gen),
        pcie_link_width: Some(pcie_width),
        pcie_replays: Some(if scenario == Scenario::PcieDegraded {
            (seconds * 3.0) as u64
        } else {
            0
        }),
        virtualization_mode: Some(if hidden {
            VirtualizationMode::Passthrough
        } else {
            VirtualizationMode::Bare
        }),
        mig_enabled: Some(scenario == Scenario::Mig),
        link_rates: links
            .iter()
            .map(|l| (l.rx_bytes_per_second, l.tx_bytes_per_second))
            .collect(),
        links,
        mig,
        processes,
        processes_unlisted: None,
        process_shares_read: true,
        quiet: false,
    }
}

/// The integral of a scenario's power since the first sample, from a level
/// that differs per GPU: the exact counter the collector's integration is
/// checked against, for a GPU that played `scenario` throughout (the
/// backend carries it over a change of scenario: `SimBackend::sample`).
fn energy_joules(p: &Profile, index: u32, scenario: Scenario, seconds: f64) -> f64 {
    let (power_base, power_swing) = power_curve(p, scenario);
    1.0e6 * f64::from(index + 1)
        + power_base * seconds
        + power_swing * WOBBLE_PERIOD_SECONDS / TAU
            * (f64::from(index).cos()
                - (TAU * seconds / WOBBLE_PERIOD_SECONDS + f64::from(index)).cos())
}

/// A scenario's power draw: a level, and how far the wobble moves it.
pub fn power_curve(p: &Profile, scenario: Scenario) -> (f64, f64) {
    match scenario {
        // An idle board's draw moves a little (fans, clocks, sensors), so
        // the integration between a quiet GPU's spaced exact reads has an
        // error to be held to.
        Scenario::Idle => (72.0, 1.5),
        Scenario::ThermalThrottle => (590.0, 0.0),
        Scenario::PowerThrottle => (p.power_limit_watts, 0.0),
        Scenario::MemoryBound => (540.0, 10.0),
        _ => (615.0, 25.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(scenarios: &[Scenario]) -> (SimBackend, Vec<GpuIdentity>) {
        let mut b = SimBackend::new(scenarios.len() as u32, PROFILES[0], scenarios.to_vec());
        let ids = b.identities().unwrap();
        (b, ids)
    }

    #[test]
    fn counters_grow_and_values_repeat() {
        let (mut a, ids) = backend(&[Scenario::Training]);
        let (mut b, _) = backend(&[Scenario::Training]);
        let s0 = a.sample(&ids[0], 1_000_000, ReadPlan::ALL).unwrap();
        let s1 = a.sample(&ids[0], 11_000_000, ReadPlan::ALL).unwrap();
        assert!(s1.energy_joules.unwrap() > s0.energy_joules.unwrap());
        assert_eq!(
            b.sample(&ids[0], 1_000_000, ReadPlan::ALL)
                .unwrap()
                .links
                .len(),
            18
        );
        let again = b.sample(&ids[0], 11_000_000, ReadPlan::ALL).unwrap();
        assert_eq!(
            again, s1,
            "a pure function of the time since the first sample"
        );
    }

    /// A running agent's GPU is degraded and restored by writing the file;
    /// a file that is missing or names no scenario changes nothing.
    #[test]
    fn scenarios_file_turns_a_running_gpu_and_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scenarios");
        let (b, ids) = backend(&[Scenario::Training, Scenario::Training]);
        let mut b = b.with_scenarios_file(path.clone());
        let mut second = 0;
        let mut clock = |b: &mut SimBackend, gpu: usize| {
            second += 1;
            let sample = b.sample(&ids[gpu], second * 1_000_000, ReadPlan::ALL).unwrap();
            sample.sm_clock_hz.unwrap() / 1e6
        };
        assert_eq!(clock(&mut b, 1), 1980.0, "no file yet: as configured");
        std::fs::write(&path, "training\nthermal-throttle\n").unwrap();
        assert_eq!(clock(&mut b, 1), 1410.0, "GPU 1 throttled");
        assert_eq!(clock(&mut b, 0), 1980.0, "GPU 0 as it was");
        std::fs::write(&path, "training, on-fire").unwrap();
        assert_eq!(clock(&mut b, 1), 1410.0, "a bad name keeps what is in force");
        std::fs::write(&path, "training").unwrap();
        assert_eq!(clock(&mut b, 1), 1980.0, "restored: one name for every GPU");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(clock(&mut b, 1), 1980.0, "a removed file changes nothing");
        assert!(parse_scenario_list(" \n").unwrap_err().contains("no scenario"));
    }

    /// HBM held down shows where the peers' rules look: bytes/s against the
    /// peak while busy, about half a healthy step's, with the memory clock.
    #[test]
    fn hbm_degraded_halves_the_bandwidth_under_load() {
        let (mut b, ids) = backend(&[Scenario::Training, Scenario::HbmDegraded]);
        let dram = |s: &GpuSample| s.gpm.as_ref().unwrap().dram_bandwidth_ratio.unwrap();
        let healthy = b.sample(&ids[0], 0, ReadPlan::ALL).unwrap();
        let slow = b.sample(&ids[1], 0, ReadPlan::ALL).unwrap();
        let ratio = dram(&slow) / dram(&healthy);
        assert!((0.5..0.6).contains(&ratio), "{ratio}");
        assert!(slow.utilization_gpu_ratio.unwrap() > 0.9, "busy");
        assert!(slow.memory_clock_hz.unwrap() < 0.6 * healthy.memory_clock_hz.unwrap());
        assert_eq!(slow.sm_clock_hz, healthy.sm_clock_hz, "the SMs run at full clock");
    }

    #[test]
    fn xid_scenario_raises_31_then_13_each_minute() {
        let (mut b, ids) = backend(&[Scenario::Xid]);
        b.sample(&ids[0], 0, ReadPlan::ALL).unwrap();
        let first: Vec<u64> = b.take_xids().iter().map(|x| x.xid).collect();
        assert_eq!(first, vec![31]);
        b.sample(&ids[0], 59_000_000, ReadPlan::ALL).unwrap();
        assert!(b.take_xids().is_empty());
        b.sample(&ids[0], 125_000_000, ReadPlan::ALL).unwrap();
        let later: Vec<u64> = b.take_xids().iter().map(|x| x.xid).collect();
        assert_eq!(later, vec![13, 13], "minutes 1 and 2");
    }

    #[test]
    fn lost_gpu_is_an_error_with_one_xid_79() {
        let (mut b, ids) = backend(&[Scenario::Training, Scenario::Lost]);
        assert!(b.sample(&ids[0], 0, ReadPlan::ALL).is_ok());
        assert!(matches!(
            b.sample(&ids[1], 0, ReadPlan::ALL),
            Err(SampleError::Lost(_))
        ));
        assert!(matches!(
            b.sample(&ids[1], 1_000_000, ReadPlan::ALL),
            Err(SampleError::Lost(_))
        ));
        let xids: Vec<u64> = b.take_xids().iter().map(|x| x.xid).collect();
        assert_eq!(xids, vec![79]);
    }

    /// When a GPU's work changes, its counter goes on from where it was: it
    /// neither jumps to the new scenario's curve (up by hundreds of
    /// kilojoules, idle to training) nor falls back to it (training to idle,
    /// which the collector would take for a counter started again).
    #[test]
    fn the_energy_counter_goes_on_across_a_change_of_work() {
        let (b, ids) = backend(&[Scenario::Idle]);
        let mut b = b
            .turning(0, 40.0, Scenario::Training)
            .turning(0, 70.0, Scenario::Idle);
        let mut before: Option<(f64, f64)> = None;
        for second in 0..=100i64 {
            let s = b.sample(&ids[0], second * 1_000_000, ReadPlan::ALL).unwrap();
            let (energy, power) = (s.energy_joules.unwrap(), s.power_watts.unwrap());
            if let Some((energy_before, power_before)) = before {
                // The second's energy lies between the powers at its ends
                // (the wobble moves training's by under 3 W a second).
                let (low, high) = (power.min(power_before), power.max(power_before));
                let drawn = energy - energy_before;
                assert!(
                    drawn >= low - 3.0 && drawn <= high + 3.0,
                    "at {second} s: {drawn} J drawn, power {power_before} then {power} W"
                );
            }
            before = Some((energy, power));
        }
    }

    /// The energy counter is what the power drew: the counter's increase
    /// over a minute equals the power integrated finely over that minute.
    #[test]
    fn energy_is_the_integral_of_the_power() {
        for scenario in [Scenario::Training, Scenario::MemoryBound, Scenario::Idle] {
            let (mut b, ids) = backend(&[scenario, scenario]);
            let gpu = &ids[1];
            let at = |b: &mut SimBackend, ms: i64| b.sample(gpu, ms * 1000, ReadPlan::ALL).unwrap();
            let start = at(&mut b, 0).energy_joules.unwrap();
            let mut integral = 0.0;
            let mut before = at(&mut b, 0).power_watts.unwrap();
            for ms in (10..=60_000).step_by(10) {
                let now = at(&mut b, ms).power_watts.unwrap();
                integral += (before + now) / 2.0 * 0.01;
                before = now;
            }
            let end = at(&mut b, 60_000).energy_joules.unwrap();
            assert!(
                (end - start - integral).abs() < 1e-3,
                "{scenario:?}: {} against {integral}",
                end - start
            );
        }
    }

    #[test]
    fn the_plan_leaves_out_the_reads_it_skips() {
        use crate::gpu::backend::SharesRead;
        let (mut b, ids) = backend(&[Scenario::Training, Scenario::Mig]);
        let plan = ReadPlan {
            energy: false,
            process_shares: SharesRead::IfShared,
            slow: true,
            mig_enabled: None,
            skip_quiet_reads: false,
            skip_quiet_energy: false,
            hold_loaded_link: true,
            mps_clients: true,
        };
        let one = b.sample(&ids[0], 0, plan).unwrap();
        assert_eq!(one.energy_joules, None);
        assert!(one.power_watts.is_some());
        assert!(!one.process_shares_read, "one process, MIG off");
        assert_eq!(one.processes[0].sm_utilization_ratio, None);
        assert!(one.processes[0].used_memory_bytes.is_some());
        assert_eq!(
            (one.pcie_link_gen, one.pcie_link_width),
            (None, None),
            "under load, the held link is not read"
        );
        let mig = b.sample(&ids[1], 0, plan).unwrap();
        assert!(mig.process_shares_read, "MIG on: the driver splits it");
        assert!(mig
            .processes
            .iter()
            .all(|p| p.sm_utilization_ratio.is_some()));
        let all = b.sample(&ids[0], 0, ReadPlan::ALL).unwrap();
        assert!(all.process_shares_read && all.energy_joules.is_some());
        assert!(all.pcie_link_gen.is_some() && all.pcie_link_width.is_some());
    }

    #[test]
    fn every_scenario_name_parses() {
        for (name, scenario) in SCENARIOS {
            assert_eq!(Scenario::parse(name), Some(*scenario));
        }
        assert_eq!(Scenario::parse("on-fire"), None);
    }
}
