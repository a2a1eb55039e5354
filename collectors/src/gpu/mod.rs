//! `gpu`: every NVIDIA GPU through NVML (or the simulated backend): how much
//! of its peak the workload gets — utilisation and GPM activity, HBM bytes/s
//! against the peak, clocks against their maxima and why they are held down,
//! PCIe and NVLink against what the links should carry, power, temperatures,
//! ECC and remapped rows, XIDs, MIG instances, and whose processes run there.
//!
//! A GPU that errors or falls off the bus gets `up` 0, an event row and a log
//! line, and is skipped; the other GPUs go on. No driver: the collector is
//! off, with the loader's reason.
//!
//! The two reads that cost the driver most are spaced out: the exact energy
//! counter every `energy_interval_secs`, carried on in between from the
//! power readings (`energy.rs`), and the per-process shares every
//! `process_shares_interval_secs`, only where more than one process shares
//! a GPU (or MIG splits it); a lone process's shares are the GPU's
//! utilisation. The values that change rarely, or are counters read for
//! their increase (MIG and virtualisation mode, the enforced power limit,
//! NVLink link state and error counters, PCIe replays, ECC, remapped rows),
//! are read every `slow_reads_interval_secs` and carried in between; all of
//! it is read at a GPU's first tick and when it answers again. A quiet GPU
//! (nothing runs on it: `backend::is_quiet`) reads GPM and its PCIe link on
//! that cadence too, and the first tick anything runs reads them again
//! (`GpuState::settle_quiet`); a GPU under load whose link read found it at
//! its maximum holds that read for `loaded_link_interval_secs` while the load lasts
//! (`GpuState::settle_link`); a GPU quiet since its last exact energy read
//! reads the counter only every `quiet_energy_interval_secs`, its steady
//! idle power integrated in between (`GpuState::settle_energy`).
//!
//! `config.rs` holds `[collectors.gpu]`, `tables.rs` the tables, `doctor.rs`
//! `vtax doctor --gpu`, `costs.rs` what each NVML read costs on an H100 (for
//! the simulated backend's bench); this file the collector.

pub mod backend;
mod config;
pub mod costs;
mod doctor;
mod energy;
pub mod nvml;
pub(crate) mod nvml_fallback;
pub mod owner;
mod plausible;
pub mod sim;
mod tables;

use std::collections::BTreeMap;
use std::path::PathBuf;

use vtax_store::{Batch, BatchBuilder};

use self::backend::{
    GpuBackend, GpuIdentity, GpuSample, LinkSample, ReadPlan, SampleError, SharesRead,
    VirtualizationMode,
};
use self::energy::{EnergyCounter, EnergyReading};
use self::owner::Owners;
use super::{Availability, Collector, ParseError, Roots};
use crate::pci::PciFunction;

pub use self::config::GpuConfig;
pub use self::doctor::doctor_lines;
pub use self::tables::*;

/// What the collector remembers of one GPU between ticks.
#[derive(Default)]
struct GpuState {
    lost: bool,
    /// From the last sample, for the info row of a GPU that stopped answering.
    virtualization_mode: &'static str,
    mig: &'static str,
    sample_errors: u64,
    /// Values left out as not believed, since the agent started.
    values_left_out: u64,
    last_xid: Option<u64>,
    xid_by_code: BTreeMap<u64, u64>,
    problems: Vec<String>,
    /// The last sample's process list could not be read (logged once).
    processes_unlisted: bool,
    /// The values the last sample gave that are not believed, left out.
    implausible: Vec<plausible::Implausible>,
    /// The fields logged as left out and not read in range since: each is
    /// logged once when it goes out and once when it is back.
    implausible_named: Vec<&'static str>,
    /// The energy counter, exact or carried on from the power readings.
    energy: EnergyCounter,
    /// The GPU was quiet at the tick of its last exact energy read and at
    /// every tick since.
    quiet_since_exact_energy: bool,
    /// When the driver last gave the processes' shares.
    shares_read_us: Option<i64>,
    /// The shares it gave then, by pid: (SM, memory).
    shares: BTreeMap<u32, (Option<f64>, Option<f64>)>,
    /// When the slow reads were last made; `None` until the first, and
    /// again once the GPU stops answering, so that everything is read when
    /// it answers.
    slow_read_us: Option<i64>,
    /// What the last slow read gave, carried on between slow reads.
    slow: SlowValues,
    /// Whether the last tick found the GPU quiet (`backend::is_quiet`).
    was_quiet: bool,
    /// What the last quiet tick after a quiet tick read, held on the quiet
    /// ticks that skip those reads; `None` once anything runs.
    quiet_reads: Option<QuietReads>,
    /// GPM's previous sample is older than the last tick (a tick skipped
    /// GPM, or the GPU did not answer): its next figures average over more
    /// than one tick.
    gpm_span_stale: bool,
    /// The PCIe link as the last read found it under load at its maximum,
    /// held on the ticks under load that skip the link reads; `None` once
    /// a tick is not under load or a read finds the link below its maximum.
    loaded_link: Option<LoadedLink>,
}

/// A PCIe link read under load at its maximum generation and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LoadedLink {
    read_us: i64,
    gen: u32,
    width: u32,
}

/// The reads a quiet GPU makes only every `slow_reads_interval_secs`: GPM,
/// the PCIe throughput and the PCIe link, as a quiet tick read them.
#[derive(Clone, Debug, Default, PartialEq)]
struct QuietReads {
    read_us: i64,
    gpm: Option<backend::GpmMetrics>,
    link_rates: Vec<(Option<f64>, Option<f64>)>,
    pcie_rx_bytes_per_second: Option<f64>,
    pcie_tx_bytes_per_second: Option<f64>,
    pcie_link_gen: Option<u32>,
    pcie_link_width: Option<u32>,
}

impl QuietReads {
    fn of(s: &GpuSample, read_us: i64) -> QuietReads {
        QuietReads {
            read_us,
            gpm: s.gpm.clone(),
            link_rates: s.link_rates.clone(),
            pcie_rx_bytes_per_second: s.pcie_rx_bytes_per_second,
            pcie_tx_bytes_per_second: s.pcie_tx_bytes_per_second,
            pcie_link_gen: s.pcie_link_gen,
            pcie_link_width: s.pcie_link_width,
        }
    }

    fn fill(&self, s: &mut GpuSample) {
        s.gpm = self.gpm.clone();
        s.link_rates = self.link_rates.clone();
        s.pcie_rx_bytes_per_second = self.pcie_rx_bytes_per_second;
        s.pcie_tx_bytes_per_second = self.pcie_tx_bytes_per_second;
        s.pcie_link_gen = self.pcie_link_gen;
        s.pcie_link_width = self.pcie_link_width;
    }
}

/// The values of a GPU read every `slow_reads_interval_secs`, as the last
/// slow read gave them (`None`: not supported there).
#[derive(Clone, Debug, Default, PartialEq)]
struct SlowValues {
    power_limit_watts: Option<f64>,
    ecc_corrected_errors: Option<u64>,
    ecc_uncorrected_errors: Option<u64>,
    remapped_rows_correctable: Option<u64>,
    remapped_rows_uncorrectable: Option<u64>,
    remapping_pending: Option<bool>,
    remapping_failed: Option<bool>,
    pcie_replays: Option<u64>,
    virtualization_mode: Option<VirtualizationMode>,
    mig_enabled: Option<bool>,
    /// Each link's state and error counters; the rates are each tick's.
    links: Vec<LinkSample>,
}

impl SlowValues {
    /// What a sample that made the slow reads gave.
    fn of(s: &GpuSample) -> SlowValues {
        SlowValues {
            power_limit_watts: s.power_limit_watts,
            ecc_corrected_errors: s.ecc_corrected_errors,
            ecc_uncorrected_errors: s.ecc_uncorrected_errors,
            remapped_rows_correctable: s.remapped_rows_correctable,
            remapped_rows_uncorrectable: s.remapped_rows_uncorrectable,
            remapping_pending: s.remapping_pending,
            remapping_failed: s.remapping_failed,
            pcie_replays: s.pcie_replays,
            virtualization_mode: s.virtualization_mode,
            mig_enabled: s.mig_enabled,
            links: s.links.clone(),
        }
    }

    /// Puts these values on a sample that did not read them.
    fn fill(&self, s: &mut GpuSample) {
        s.power_limit_watts = self.power_limit_watts;
        s.ecc_corrected_errors = self.ecc_corrected_errors;
        s.ecc_uncorrected_errors = self.ecc_uncorrected_errors;
        s.remapped_rows_correctable = self.remapped_rows_correctable;
        s.remapped_rows_uncorrectable = self.remapped_rows_uncorrectable;
        s.remapping_pending = self.remapping_pending;
        s.remapping_failed = self.remapping_failed;
        s.pcie_replays = self.pcie_replays;
        s.virtualization_mode = self.virtualization_mode;
        s.mig_enabled = self.mig_enabled;
        s.links = self.links.clone();
    }
}

impl GpuState {
    /// The spaced-out reads of the tick at `time_us`. A GPU's first tick,
    /// and its first after it stopped answering, reads everything.
    fn plan(&self, config: &GpuConfig, time_us: i64) -> ReadPlan {
        let tick = config.interval_secs;
        let due = |last: Option<i64>, interval_secs: f64| {
            interval_secs <= 0.0
                || last.is_none_or(|at| (time_us - at) as f64 / 1e6 + tick / 2.0 >= interval_secs)
        };
        let fresh = self.slow_read_us.is_none();
        let shares_due = fresh || due(self.shares_read_us, config.process_shares_interval_secs);
        ReadPlan {
            energy: fresh
                || config.energy_interval_secs <= tick
                || self
                    .energy
                    .exact_due(time_us, config.energy_interval_secs, tick),
            process_shares: match (
                config.processes && shares_due,
                config.single_process_shares_from_utilization,
            ) {
                (false, _) => SharesRead::Skip,
                (true, true) => SharesRead::IfShared,
                (true, false) => SharesRead::Always,
            },
            slow: due(self.slow_read_us, config.slow_reads_interval_secs),
            mps_clients: config.processes,
            mig_enabled: self.slow.mig_enabled,
            skip_quiet_reads: !fresh
                && self.quiet_reads.as_ref().is_some_and(|q| {
                    !due(Some(q.read_us), config.slow_reads_interval_secs)
                }),
            skip_quiet_energy: !fresh
                && self.quiet_since_exact_energy
                && config.energy_interval_secs > tick
                && config.quiet_energy_interval_secs > config.energy_interval_secs
                && !self
                    .energy
                    .exact_due(time_us, config.quiet_energy_interval_secs, tick),
            hold_loaded_link: !fresh
                && self.loaded_link.is_some_and(|l| {
                    !due(Some(l.read_us), config.loaded_link_interval_secs)
                }),
        }
    }

    /// Keeps and counts the values this tick left out as not believed, and
    /// logs each field once when it goes out and once when it is read in
    /// range again.
    fn note_implausible(&mut self, g: &GpuIdentity, now: plausible::Screened) {
        for i in &now.left_out {
            if !self.implausible_named.contains(&i.field) {
                tracing::warn!(
                    gpu = g.index,
                    uuid = %g.uuid,
                    field = i.field,
                    value = i.value,
                    why = i.why,
                    "The driver reported a value not believed; left out while it lasts."
                );
                self.implausible_named.push(i.field);
            }
        }
        // Back only once read in range again: a tick that did not read the
        // field (a held read, GPM after a stale span) says nothing of it.
        self.implausible_named.retain(|field| {
            let back = now.back_in_range(field);
            if back {
                tracing::info!(
                    gpu = g.index,
                    uuid = %g.uuid,
                    field = *field,
                    "The driver reports this value within range again."
                );
            }
            !back
        });
        self.values_left_out += now.left_out.len() as u64;
        self.implausible = now.left_out;
    }

    /// Carries the energy counter on with this tick's readings, and keeps
    /// whether the GPU has been quiet since its last exact read.
    fn settle_energy(&mut self, s: &GpuSample, time_us: i64) -> EnergyReading {
        let reading = self.energy.update(time_us, s.power_watts, s.energy_joules);
        // A read the counter took (not one it threw out as no number).
        let exact_read = s.energy_joules.is_some() && reading.exact_age_seconds == Some(0.0);
        self.quiet_since_exact_energy = if exact_read {
            s.quiet
        } else {
            self.quiet_since_exact_energy && s.quiet
        };
        reading
    }

    /// Puts the held quiet reads on a tick that skipped them (the plan let
    /// it, and the backend found the GPU quiet), and decides what the next
    /// quiet ticks may hold. `gpm_expected`: GPM is on and
    /// the GPU has it.
    ///
    /// Held figures come only from a tick that was quiet, as was the tick
    /// before it, so that GPM's interval had nothing running at either end;
    /// a read that gave no GPM figures where GPM runs (a new backend's first
    /// sample, a failed call) is not held. GPM's figures average over the
    /// time since its previous sample: on the first tick that is not quiet
    /// after skipped ticks, they would spread the new work over the quiet
    /// seconds before it, so that tick has none (as a GPU's first tick has
    /// none); on a quiet tick, the average of quiet seconds is kept.
    fn settle_quiet(
        &mut self,
        plan: ReadPlan,
        s: &mut GpuSample,
        time_us: i64,
        gpm_expected: bool,
    ) {
        if plan.skip_quiet_reads && s.quiet {
            if let Some(held) = &self.quiet_reads {
                held.fill(s);
            }
            self.gpm_span_stale = true;
        } else {
            if self.gpm_span_stale && !s.quiet && s.gpm.take().is_some() {
                // The PCIe and NVLink rates were GPM's too.
                s.link_rates.clear();
                s.pcie_rx_bytes_per_second = None;
                s.pcie_tx_bytes_per_second = None;
            }
            self.gpm_span_stale = false;
            let holdable = s.quiet && self.was_quiet && (s.gpm.is_some() || !gpm_expected);
            self.quiet_reads = holdable.then(|| QuietReads::of(s, time_us));
        }
        self.was_quiet = s.quiet;
    }

    /// Puts the held link on a tick under load that skipped its reads, and
    /// decides whether the next ticks may hold this one's. Only a read under
    /// load that found the link at its maximum is held, and only while every
    /// tick stays under load: a link below its maximum under load (the
    /// problem `problems_of` reports) is read every tick, so that its
    /// recovery shows at once, and a tick below the load threshold reads it
    /// again, because an idle link trains down by design and a value held
    /// from before the load would show a link it no longer has. A link that
    /// trains down under load shows up to `loaded_link_interval_secs` late.
    fn settle_link(&mut self, plan: ReadPlan, s: &mut GpuSample, time_us: i64, g: &GpuIdentity) {
        if !backend::under_load(s.utilization_gpu_ratio) {
            self.loaded_link = None;
        } else if plan.holds_loaded_link(s.utilization_gpu_ratio) {
            if let Some(held) = self.loaded_link {
                s.pcie_link_gen = Some(held.gen);
                s.pcie_link_width = Some(held.width);
            }
        } else {
            self.loaded_link = match (
                s.pcie_link_gen,
                s.pcie_link_width,
                g.pcie_link_gen_max,
                g.pcie_link_width_max,
            ) {
                (Some(gen), Some(width), Some(gen_max), Some(width_max))
                    if gen >= gen_max && width >= width_max =>
                {
                    Some(LoadedLink {
                        read_us: time_us,
                        gen,
                        width,
                    })
                }
                _ => None,
            };
        }
    }

    /// The GPU gave no sample: everything is read when it answers, and the
    /// GPM figures of that tick span the silence.
    fn forget_after_silence(&mut self) {
        self.slow_read_us = None;
        self.was_quiet = false;
        self.quiet_since_exact_energy = false;
        self.quiet_reads = None;
        self.gpm_span_stale = true;
        self.loaded_link = None;
    }

    /// Keeps what a slow read gave, or puts the last one's values on a
    /// sample that did not read them; either way each link gets this
    /// tick's GPM rates.
    fn settle_slow(&mut self, plan: ReadPlan, s: &mut GpuSample, time_us: i64) {
        if plan.slow {
            self.slow_read_us = Some(time_us);
            self.slow = SlowValues::of(s);
        } else {
            self.slow.fill(s);
        }
        for l in &mut s.links {
            let (rx, tx) = s
                .link_rates
                .get(l.link as usize)
                .copied()
                .unwrap_or((None, None));
            l.rx_bytes_per_second = rx.filter(|_| l.active);
            l.tx_bytes_per_second = tx.filter(|_| l.active);
        }
    }

    /// Fills the shares the driver was not asked for this tick: a lone
    /// process (MIG off) takes the GPU's utilisation, the others keep what
    /// the driver last gave them.
    fn settle_shares(&mut self, config: &GpuConfig, s: &mut GpuSample, time_us: i64) {
        if s.process_shares_read {
            self.shares_read_us = Some(time_us);
            self.shares = s
                .processes
                .iter()
                .map(|p| (p.pid, (p.sm_utilization_ratio, p.memory_utilization_ratio)))
                .collect();
            return;
        }
        if config.single_process_shares_from_utilization
            && !backend::shares_need_the_driver(s.processes.len(), s.mig_enabled)
        {
            for p in &mut s.processes {
                p.sm_utilization_ratio = s.utilization_gpu_ratio;
                p.memory_utilization_ratio = s.utilization_memory_ratio;
            }
            return;
        }
        self.shares
            .retain(|pid, _| s.processes.iter().any(|p| p.pid == *pid));
        for p in &mut s.processes {
            if let Some(&(sm, memory)) = self.shares.get(&p.pid) {
                p.sm_utilization_ratio = sm;
                p.memory_utilization_ratio = memory;
            }
        }
    }
}

/// The collector.
pub struct Gpu {
    config: GpuConfig,
    backend: Option<Box<dyn GpuBackend>>,
    gpus: Vec<GpuIdentity>,
    states: Vec<GpuState>,
    driver_version: String,
    owners: Owners,
    /// What the collector this one replaced on a reload knew of each GPU,
    /// by UUID, until the probe finds the GPUs again.
    carried: BTreeMap<String, GpuState>,
    /// Where the PCI bus is seen: the GPUs on it are what NVML should list.
    sysfs: PathBuf,
    /// NVIDIA GPUs on the PCI bus that NVML does not list, found at the
    /// probe (NVML enumerates its GPUs once, at init): the collector's
    /// sources that read badly while it reads the others.
    unlisted: Vec<ParseError>,
}

impl Gpu {
    /// The collector on the backend its config names (NVML or simulated).
    pub fn new(config: &GpuConfig, roots: &Roots) -> Gpu {
        Gpu {
            config: config.clone(),
            backend: None,
            gpus: Vec::new(),
            states: Vec::new(),
            driver_version: String::new(),
            owners: Owners::new(roots),
            carried: BTreeMap::new(),
            sysfs: roots.sysfs.clone(),
            unlisted: Vec::new(),
        }
    }

    /// The NVIDIA GPUs on the PCI bus that NVML on this host should read:
    /// none for the simulator, none given to virtual machines, and no
    /// virtual function (a vGPU host's SR-IOV slices of a GPU are NVIDIA
    /// 3D controllers too, and NVML lists the physical GPU alone).
    fn gpus_on_pci(&self) -> Vec<PciFunction> {
        if self.config.simulate_gpus > 0 {
            return Vec::new();
        }
        let mut gpus = crate::pci::nvidia_gpus(&self.sysfs).unwrap_or_default();
        gpus.retain(|g| !g.given_to_a_vm() && !g.virtual_function);
        gpus
    }

    /// Why no GPU is read, as the probe says it: the source is absent when
    /// no GPU is on the PCI bus for NVML to read, and reads badly when GPUs
    /// are there and NVML cannot read them, so that the collector counts as
    /// failing (`vtax_collector_success` 0, the `VtaxCollectorFailing`
    /// alert) instead of waiting quietly on a node whose GPUs go unread.
    fn unread(&self, reason: String) -> Availability {
        let on_pci = self.gpus_on_pci();
        if on_pci.is_empty() {
            return Availability::Absent(reason);
        }
        let each: Vec<String> = on_pci.iter().map(PciFunction::describe).collect();
        let gpus = match on_pci.len() {
            1 => "1 NVIDIA GPU is".to_string(),
            n => format!("{n} NVIDIA GPUs are"),
        };
        Availability::Failed(format!("{gpus} on the PCI bus ({}), but {reason}", each.join(", ")))
    }

    /// The GPUs on the PCI bus that `listed` (NVML's) leaves out, each as
    /// a source that reads badly, with what the driver bound to it says.
    fn unlisted_on_pci(&self, listed: &[GpuIdentity]) -> Vec<ParseError> {
        self.gpus_on_pci()
            .into_iter()
            .filter(|g| !listed.iter().any(|l| crate::pci::same_pci_function(&l.pci_bus_id, &g.address)))
            .map(|g| {
                let why = match g.driver.as_deref() {
                    Some("nvidia") => {
                        "an NVIDIA GPU bound to the nvidia driver that NVML does not list: the \
                         driver did not bring it up (dmesg names why, RmInitAdapter failed), it \
                         fell off the bus before NVML started, or the agent's container was given \
                         only some GPUs (NVIDIA_VISIBLE_DEVICES); restart the agent once it is \
                         back (NVML lists GPUs when it starts)"
                            .to_string()
                    }
                    Some(driver) => format!(
                        "an NVIDIA GPU bound to {driver}, not to the nvidia driver: NVML cannot read it"
                    ),
                    None => "an NVIDIA GPU bound to no driver: the nvidia driver did not take it \
                             (dmesg says why)"
                        .to_string(),
                };
                ParseError {
                    path: self.sysfs.join("bus/pci/devices").join(&g.address).display().to_string(),
                    line: 0,
                    reason: why,
                }
            })
            .collect()
    }
}

/// Builders of every table, one tick's rows.
struct Rows {
    gpu: BatchBuilder,
    info: BatchBuilder,
    health: BatchBuilder,
    clock_event: BatchBuilder,
    nvlink: BatchBuilder,
    mig: BatchBuilder,
    process: BatchBuilder,
    xid: BatchBuilder,
    event: BatchBuilder,
}

impl Rows {
    fn new() -> Rows {
        Rows {
            gpu: BatchBuilder::new(&GPU),
            info: BatchBuilder::new(&INFO),
            health: BatchBuilder::new(&HEALTH),
            clock_event: BatchBuilder::new(&CLOCK_EVENT),
            nvlink: BatchBuilder::new(&NVLINK),
            mig: BatchBuilder::new(&MIG),
            process: BatchBuilder::new(&PROCESS),
            xid: BatchBuilder::new(&XID),
            event: BatchBuilder::new(&EVENT),
        }
    }

    fn finish(mut self) -> Vec<Batch> {
        [
            &mut self.gpu,
            &mut self.info,
            &mut self.health,
            &mut self.clock_event,
            &mut self.nvlink,
            &mut self.mig,
            &mut self.process,
            &mut self.xid,
            &mut self.event,
        ]
        .into_iter()
        .map(BatchBuilder::finish)
        .filter(|b| !b.is_empty())
        .collect()
    }
}

impl Gpu {
    fn push_sample(
        &mut self,
        rows: &mut Rows,
        at: usize,
        s: &GpuSample,
        energy: EnergyReading,
        time_us: i64,
    ) -> anyhow::Result<()> {
        let g = &self.gpus[at];
        let index = g.index.to_string();
        let gpm = s.gpm.clone().unwrap_or_default();
        let peak = g.hbm_peak_bytes_per_second();
        let links_up = s.links.iter().filter(|l| l.active).count() as u64;
        // A PCIe board has NVLink only through bridges, which its name does
        // not tell: more links up than the name gives are bridges, the
        // board's own (a peak of 0 hid an H100 PCIe's bridged 600 GB/s).
        let links_product = g
            .nvlink_links_product
            .map(|named| named.max(u32::try_from(links_up).unwrap_or(u32::MAX)));
        let row = GpuRow {
            gpu: &index,
            gpu_uuid: &g.uuid,
            utilization_ratio: s.utilization_gpu_ratio,
            memory_utilization_ratio: s.utilization_memory_ratio,
            sm_active_ratio: gpm.sm_active_ratio,
            sm_occupancy_ratio: gpm.sm_occupancy_ratio,
            tensor_active_ratio: gpm.tensor_active_ratio,
            dram_bandwidth_ratio: gpm.dram_bandwidth_ratio,
            hbm_bytes_per_second: gpm.dram_bandwidth_ratio.zip(peak).map(|(r, p)| r * p),
            hbm_peak_bytes_per_second: peak,
            sm_clock_hertz: s.sm_clock_hz,
            sm_clock_max_hertz: g.sm_clock_max_hz,
            memory_clock_hertz: s.memory_clock_hz,
            memory_clock_max_hertz: g.memory_clock_max_hz,
            clock_event_reasons: s.clock_event_reasons,
            power_watts: s.power_watts,
            power_limit_watts: s.power_limit_watts,
            energy_joules: energy.joules,
            energy_exact_age_seconds: energy.exact_age_seconds,
            energy_integration_error_joules: energy.integration_error_joules,
            temperature_celsius: s.temperature_celsius,
            memory_temperature_celsius: s.memory_temperature_celsius,
            memory_used_bytes: s.memory_used_bytes,
            memory_total_bytes: s.memory_total_bytes,
            ecc_corrected_errors: s.ecc_corrected_errors,
            ecc_uncorrected_errors: s.ecc_uncorrected_errors,
            remapped_rows_correctable: s.remapped_rows_correctable,
            remapped_rows_uncorrectable: s.remapped_rows_uncorrectable,
            remapping_pending: s.remapping_pending.map(u64::from),
            remapping_failed: s.remapping_failed.map(u64::from),
            // GPM's average over the interval where it runs, else NVML's
            // 20 ms sample.
            pcie_rx_bytes_per_second: gpm.pcie_rx_bytes_per_second.or(s.pcie_rx_bytes_per_second),
            pcie_tx_bytes_per_second: gpm.pcie_tx_bytes_per_second.or(s.pcie_tx_bytes_per_second),
            pcie_link_gen: s.pcie_link_gen.map(u64::from),
            pcie_link_gen_max: g.pcie_link_gen_max.map(u64::from),
            pcie_link_width: s.pcie_link_width.map(u64::from),
            pcie_link_width_max: g.pcie_link_width_max.map(u64::from),
            pcie_replays: s.pcie_replays,
            nvlink_total_rx_bytes_per_second: gpm.nvlink_rx_bytes_per_second,
            nvlink_total_tx_bytes_per_second: gpm.nvlink_tx_bytes_per_second,
            nvlink_links_up: links_up,
            nvlink_links_product: links_product.map(u64::from),
            nvlink_peak_bytes_per_second: links_product
                .and_then(|links| g.nvlink_peak_bytes_per_second_over(links)),
        };
        rows.gpu.push_row(time_us, &row)?;

        let state = &mut self.states[at];
        state.virtualization_mode = s.virtualization_mode.map_or("unknown", |m| m.as_str());
        state.mig = match s.mig_enabled {
            Some(true) => "on",
            Some(false) => "off",
            None => "unknown",
        };
        if let Some(reasons) = s.clock_event_reasons {
            for (reason, bit) in CLOCK_EVENT_REASONS {
                let row = GpuClockEventRow {
                    gpu: &index,
                    gpu_uuid: &g.uuid,
                    reason,
                    active: u64::from(reasons & bit != 0),
                };
                rows.clock_event.push_row(time_us, &row)?;
            }
        }
        for l in &s.links {
            let row = GpuNvlinkRow {
                gpu: &index,
                gpu_uuid: &g.uuid,
                link: &l.link.to_string(),
                up: u64::from(l.active),
                rx_bytes_per_second: l.rx_bytes_per_second,
                tx_bytes_per_second: l.tx_bytes_per_second,
                crc_errors: l.crc_errors,
                replay_errors: l.replay_errors,
                recovery_errors: l.recovery_errors,
            };
            rows.nvlink.push_row(time_us, &row)?;
        }
        for m in &s.mig {
            let row = GpuMigRow {
                gpu: &index,
                gpu_uuid: &g.uuid,
                gpu_instance: &m
                    .gpu_instance
                    .map_or_else(|| "unknown".to_string(), |id| id.to_string()),
                mig_uuid: &m.uuid,
                profile: &m.profile,
                memory_used_bytes: m.memory_used_bytes,
                memory_total_bytes: m.memory_total_bytes,
                sm_active_ratio: m.sm_active_ratio,
            };
            rows.mig.push_row(time_us, &row)?;
        }
        if self.config.processes {
            for p in &s.processes {
                let owner = self.owners.of(p.pid);
                let row = GpuProcessRow {
                    gpu: &index,
                    gpu_uuid: &g.uuid,
                    pid: &p.pid.to_string(),
                    command: &owner.command,
                    workload: owner.workload,
                    cgroup: &owner.cgroup,
                    container: &owner.container,
                    pod_uid: &owner.pod_uid,
                    slurm_job: &owner.slurm_job,
                    used_memory_bytes: p.used_memory_bytes,
                    sm_utilization_ratio: p.sm_utilization_ratio,
                    memory_utilization_ratio: p.memory_utilization_ratio,
                    gpu_instance: p.gpu_instance.map(u64::from),
                };
                rows.process.push_row(time_us, &row)?;
            }
        }
        let state = &mut self.states[at];
        match (&s.processes_unlisted, state.processes_unlisted) {
            (Some(why), false) => tracing::warn!(
                gpu = g.index,
                uuid = %g.uuid,
                reason = %why,
                "The driver does not list this GPU's compute processes: who uses it is not known."
            ),
            (None, true) => tracing::info!(
                gpu = g.index,
                uuid = %g.uuid,
                "The driver lists this GPU's compute processes again."
            ),
            _ => {}
        }
        state.processes_unlisted = s.processes_unlisted.is_some();
        state.problems = problems_of(g, s, links_up);
        for i in &state.implausible {
            state.problems.push(format!(
                "GPU {} ({}): the driver reported {} = {}, {}; left out",
                g.index, g.uuid, i.field, i.value, i.why
            ));
        }
        Ok(())
    }
}

/// What an operator should look at on one GPU, from one sample.
fn problems_of(g: &GpuIdentity, s: &GpuSample, links_up: u64) -> Vec<String> {
    let mut problems = Vec::new();
    let who = format!("GPU {} ({})", g.index, g.uuid);
    let busy = backend::under_load(s.utilization_gpu_ratio);
    if let (true, Some(gen), Some(gen_max), Some(width), Some(width_max)) = (
        busy,
        s.pcie_link_gen,
        g.pcie_link_gen_max,
        s.pcie_link_width,
        g.pcie_link_width_max,
    ) {
        if gen < gen_max || width < width_max {
            problems.push(format!(
                "{who}: PCIe link at Gen{gen} x{width} under load; it can do Gen{gen_max} x{width_max}"
            ));
        }
    }
    if let Some(product) = g.nvlink_links_product.filter(|&n| n > 0) {
        if links_up < u64::from(product) {
            problems.push(format!(
                "{who}: {links_up} of {product} NVLink links up (down, or hidden by a hypervisor)"
            ));
        }
    }
    let held: Vec<&str> = CLOCK_EVENT_REASONS
        .iter()
        .filter(|(name, bit)| {
            s.clock_event_reasons.unwrap_or(0) & bit != 0
                // Settings and idleness, not a loss: as the detector's
                // THROTTLE_REASONS_MASK leaves them out.
                && !matches!(
                    *name,
                    "gpu_idle" | "applications_clocks_setting" | "sync_boost" | "display_clock_setting"
                )
        })
        .map(|(name, _)| *name)
        .collect();
    if !held.is_empty() {
        problems.push(format!("{who}: clocks held down by {}", held.join(", ")));
    }
    if let Some(why) = &s.processes_unlisted {
        problems.push(format!(
            "{who}: the driver did not list its compute processes ({why}): who uses it is not known"
        ));
    }
    if s.remapping_pending == Some(true) {
        problems.push(format!("{who}: an HBM row remapping waits for a GPU reset"));
    }
    if s.remapping_failed == Some(true) {
        problems.push(format!(
            "{who}: an HBM row remapping failed: the GPU needs service"
        ));
    }
    problems
}

/// Reads again the facts of a GPU that was lost when it was found, now that
/// it answers: without its UUID its series would stay apart from the ones
/// it had, and its XIDs, which arrive by UUID, would find no GPU.
fn identify_again(backend: &mut dyn GpuBackend, gpu: &mut GpuIdentity) {
    let found = backend.identity(gpu.index).filter(|g| !g.uuid_unread());
    if let Some(found) = found {
        tracing::info!(
            gpu = found.index,
            uuid = %found.uuid,
            name = %found.name,
            "GPU identified now that it answers."
        );
        *gpu = found;
    }
}

impl Collector for Gpu {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn probe(&mut self) -> Availability {
        // The backend taken over on a reload goes on (its XID thread with
        // the XIDs it holds, the simulator's clock); otherwise a new one.
        let backend = match self
            .backend
            .take()
            .map_or_else(|| self.config.backend(self.owners.procfs()), Ok)
        {
            Ok(b) => self.backend.insert(b),
            Err(reason) => return self.unread(reason),
        };
        self.gpus = match backend.identities() {
            Ok(gpus) if gpus.is_empty() => {
                return self.unread("the NVIDIA driver is loaded but sees no GPU".into())
            }
            Ok(gpus) => gpus,
            Err(reason) => return self.unread(reason),
        };
        self.unlisted = self.unlisted_on_pci(&self.gpus);
        let backend = self.backend.as_mut().expect("put there above");
        self.driver_version = backend.driver_version();
        let mut carried = std::mem::take(&mut self.carried);
        self.states = self
            .gpus
            .iter()
            .map(|g| {
                carried.remove(&g.uuid).unwrap_or_else(|| GpuState {
                    virtualization_mode: "unknown",
                    mig: "unknown",
                    ..GpuState::default()
                })
            })
            .collect();
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        for g in &self.gpus {
            *names.entry(g.name.as_str()).or_default() += 1;
        }
        let models: Vec<String> = names.iter().map(|(n, c)| format!("{c} × {n}")).collect();
        let gpm = self.gpus.iter().filter(|g| g.gpm_supported).count();
        Availability::Available(format!(
            "{} ({}, driver {}), GPM on {gpm} of {}",
            models.join(", "),
            backend.kind(),
            self.driver_version,
            self.gpus.len()
        ))
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        let mut rows = Rows::new();
        let mut answered = vec![false; self.gpus.len()];
        for (at, answered_at) in answered.iter_mut().enumerate() {
            let backend = self
                .backend
                .as_mut()
                .ok_or_else(|| anyhow::anyhow!("the GPU collector was not probed"))?;
            let plan = self.states[at].plan(&self.config, time_us);
            let result = backend.sample(&self.gpus[at], time_us, plan);
            if result.is_ok() && self.gpus[at].uuid_unread() {
                identify_again(backend.as_mut(), &mut self.gpus[at]);
            }
            let g = &self.gpus[at];
            let (index, uuid) = (g.index.to_string(), g.uuid.clone());
            match result {
                Ok(mut sample) => {
                    if self.states[at].lost {
                        tracing::info!(gpu = g.index, uuid = %uuid, "GPU answers again.");
                        let row = GpuEventRow {
                            gpu: &index,
                            gpu_uuid: &uuid,
                            kind: "recovered",
                            code: 0,
                        };
                        rows.event.push_row(time_us, &row)?;
                        self.states[at].lost = false;
                    }
                    *answered_at = true;
                    let state = &mut self.states[at];
                    state.settle_quiet(plan, &mut sample, time_us, self.config.gpm && g.gpm_supported);
                    state.settle_link(plan, &mut sample, time_us, g);
                    state.settle_slow(plan, &mut sample, time_us);
                    state.settle_shares(&self.config, &mut sample, time_us);
                    // After the held reads are put on the sample, so a value
                    // held between reads is left out (and named) on every
                    // tick it is held, not only where it was read; before
                    // the energy integration and the rows.
                    let mut screened = plausible::screen(&mut sample);
                    let energy = state.settle_energy(&sample, time_us);
                    if let Some(value) = energy.doubted_joules {
                        screened.left_out.push(plausible::Implausible {
                            field: "energy_joules",
                            value,
                            why: energy::DOES_NOT_FOLLOW,
                        });
                    }
                    state.note_implausible(g, screened);
                    self.push_sample(&mut rows, at, &sample, energy, time_us)?;
                }
                Err(SampleError::Lost(why)) => {
                    let state = &mut self.states[at];
                    if !state.lost {
                        tracing::warn!(gpu = g.index, uuid = %uuid, reason = %why, "GPU lost; skipped until it answers again, the other GPUs go on.");
                        let row = GpuEventRow {
                            gpu: &index,
                            gpu_uuid: &uuid,
                            kind: "lost",
                            code: 0,
                        };
                        rows.event.push_row(time_us, &row)?;
                        state.lost = true;
                    }
                    state.forget_after_silence();
                    state.sample_errors += 1;
                    state.problems = vec![format!("GPU {index} ({uuid}): lost: {why}")];
                }
                Err(SampleError::Failed(why)) => {
                    let state = &mut self.states[at];
                    if state.sample_errors == 0 {
                        tracing::warn!(gpu = g.index, uuid = %uuid, reason = %why, "Reading a GPU failed; retried every tick.");
                    }
                    state.forget_after_silence();
                    state.sample_errors += 1;
                    state.problems = vec![format!("GPU {index} ({uuid}): read failed: {why}")];
                }
            }
        }
        if self.config.processes {
            self.owners.retain_seen();
        }
        let xids = self
            .backend
            .as_mut()
            .map(|b| b.take_xids())
            .unwrap_or_default();
        for x in xids {
            let Some(at) = self.gpus.iter().position(|g| g.uuid == x.uuid) else {
                continue;
            };
            let index = self.gpus[at].index.to_string();
            tracing::warn!(gpu = %index, uuid = %x.uuid, xid = x.xid, "XID error.");
            let row = GpuEventRow {
                gpu: &index,
                gpu_uuid: &x.uuid,
                kind: "xid",
                code: x.xid,
            };
            rows.event.push_row(x.time_us, &row)?;
            let state = &mut self.states[at];
            state.last_xid = Some(x.xid);
            *state.xid_by_code.entry(x.xid).or_default() += 1;
        }
        let backend = self.backend.as_ref().map_or("", |b| b.kind());
        for (at, g) in self.gpus.iter().enumerate() {
            let state = &self.states[at];
            let index = g.index.to_string();
            // Every GPU found keeps its info row, a lost one too: its facts
            // are what an operator needs to find it.
            let info = GpuInfoRow {
                gpu: &index,
                gpu_uuid: &g.uuid,
                name: &g.name,
                pci_bus_id: &g.pci_bus_id,
                architecture: &g.architecture,
                virtualization_mode: state.virtualization_mode,
                mig: state.mig,
                driver_version: &self.driver_version,
                backend,
                info: 1,
            };
            rows.info.push_row(time_us, &info)?;
            let health = GpuHealthRow {
                gpu: &index,
                gpu_uuid: &g.uuid,
                up: u64::from(answered[at]),
                sample_errors: state.sample_errors,
                values_left_out: state.values_left_out,
                last_xid: state.last_xid,
            };
            rows.health.push_row(time_us, &health)?;
            for (code, n) in &state.xid_by_code {
                let row = GpuXidRow {
                    gpu: &index,
                    gpu_uuid: &g.uuid,
                    xid: &code.to_string(),
                    errors: *n,
                };
                rows.xid.push_row(time_us, &row)?;
            }
        }
        Ok(rows.finish())
    }

    /// Carries on each GPU's counts (failed reads, XIDs by code) and, when
    /// the backend settings are the same, the backend itself: a new one
    /// would start its counts, and the simulator its clock, from zero.
    fn take_over(&mut self, previous: Box<dyn Collector>) {
        let Ok(previous) = previous.into_any().downcast::<Gpu>() else {
            return;
        };
        let Gpu {
            config,
            backend,
            gpus,
            states,
            ..
        } = *previous;
        if config.same_backend(&self.config) {
            self.backend = backend;
        }
        self.carried = gpus.into_iter().map(|g| g.uuid).zip(states).collect();
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.unlisted.clone()
    }

    // The XID counts are the agent's own: restarted from zero they would
    // come back at 1 with the next XID of a code counted once before, which
    // `increase()` cannot tell from no XID at all.
    fn resumes_from(&self) -> Option<&'static vtax_store::TableDef> {
        Some(&XID)
    }

    fn resume(&mut self, latest: &[crate::LatestRow]) {
        // Tags: gpu, gpu_uuid, xid; field: errors.
        for row in latest {
            let (Some(uuid), Some(code)) = (row.tags.get(1), row.tags.get(2)) else {
                continue;
            };
            let (Ok(code), Some(Some(errors))) = (code.parse::<u64>(), row.fields.first()) else {
                continue;
            };
            if uuid.is_empty() || !errors.is_finite() || *errors < 1.0 {
                continue;
            }
            let state = self.carried.entry(uuid.clone()).or_insert_with(|| GpuState {
                virtualization_mode: "unknown",
                mig: "unknown",
                ..GpuState::default()
            });
            state.xid_by_code.insert(code, *errors as u64);
        }
    }

    fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .states
            .iter()
            .flat_map(|s| s.problems.iter().cloned())
            .collect();
        for (g, s) in self.gpus.iter().zip(&self.states) {
            if let Some(code) = s.last_xid {
                problems.push(format!(
                    "GPU {} ({}): {} XID error(s), the last XID {code}",
                    g.index,
                    g.uuid,
                    s.xid_by_code.values().sum::<u64>()
                ));
            }
        }
        problems
    }
}

#[cfg(test)]
pub(crate) mod tests;
