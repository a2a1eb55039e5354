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
//! it is read at a GPU's first tick and when it answers again.
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
pub mod owner;
pub mod sim;
mod tables;

use std::collections::BTreeMap;

use vtax_store::{Batch, BatchBuilder};

use self::backend::{
    GpuBackend, GpuIdentity, GpuSample, LinkSample, ReadPlan, SampleError, SharesRead,
    VirtualizationMode,
};
use self::energy::{EnergyCounter, EnergyReading};
use self::owner::Owners;
use super::{Availability, Collector, Roots};

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
    last_xid: Option<u64>,
    xid_by_code: BTreeMap<u64, u64>,
    problems: Vec<String>,
    /// The energy counter, exact or carried on from the power readings.
    energy: EnergyCounter,
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
            mig_enabled: self.slow.mig_enabled,
        }
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
        }
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
            nvlink_links_product: g.nvlink_links_product.map(u64::from),
            nvlink_peak_bytes_per_second: g.nvlink_peak_bytes_per_second(),
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
                gpu_instance: &m.gpu_instance.to_string(),
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
        self.states[at].problems = problems_of(g, s, links_up);
        Ok(())
    }
}

/// What an operator should look at on one GPU, from one sample.
fn problems_of(g: &GpuIdentity, s: &GpuSample, links_up: u64) -> Vec<String> {
    let mut problems = Vec::new();
    let who = format!("GPU {} ({})", g.index, g.uuid);
    let busy = s.utilization_gpu_ratio.unwrap_or(0.0) >= 0.5;
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
                && !matches!(
                    *name,
                    "gpu_idle" | "applications_clocks_setting" | "display_clock_setting"
                )
        })
        .map(|(name, _)| *name)
        .collect();
    if !held.is_empty() {
        problems.push(format!("{who}: clocks held down by {}", held.join(", ")));
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
            .map_or_else(|| self.config.backend(), Ok)
        {
            Ok(b) => self.backend.insert(b),
            Err(reason) => return Availability::Absent(reason),
        };
        self.gpus = match backend.identities() {
            Ok(gpus) if gpus.is_empty() => {
                return Availability::Absent("the NVIDIA driver is loaded but sees no GPU".into())
            }
            Ok(gpus) => gpus,
            Err(reason) => return Availability::Absent(reason),
        };
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
            let g = &self.gpus[at];
            let plan = self.states[at].plan(&self.config, time_us);
            let result = backend.sample(g, time_us, plan);
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
                    state.settle_slow(plan, &mut sample, time_us);
                    state.settle_shares(&self.config, &mut sample, time_us);
                    let energy =
                        state
                            .energy
                            .update(time_us, sample.power_watts, sample.energy_joules);
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
                    state.slow_read_us = None;
                    state.sample_errors += 1;
                    state.problems = vec![format!("GPU {index} ({uuid}): lost: {why}")];
                }
                Err(SampleError::Failed(why)) => {
                    let state = &mut self.states[at];
                    if state.sample_errors == 0 {
                        tracing::warn!(gpu = g.index, uuid = %uuid, reason = %why, "Reading a GPU failed; retried every tick.");
                    }
                    state.slow_read_us = None;
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
pub(crate) mod tests {
    use self::config::DEFAULT_ENERGY_INTERVAL_SECS;
    use super::*;
    use vtax_store::batch::Values;
    use vtax_store::schema::TableDef;

    pub(crate) fn simulated(scenarios: &[&str]) -> Gpu {
        let config = GpuConfig {
            simulate_gpus: scenarios.len() as u32,
            simulate_scenarios: scenarios.iter().map(|s| s.to_string()).collect(),
            ..GpuConfig::default()
        };
        let roots = Roots {
            procfs: "/nonexistent/proc".into(),
            sysfs: "/nonexistent/sys".into(),
            ..Roots::default()
        };
        let mut gpu = Gpu::new(&config, &roots);
        assert!(matches!(gpu.probe(), Availability::Available(_)));
        gpu
    }

    fn table<'a>(batches: &'a [Batch], table: &TableDef) -> Option<&'a Batch> {
        batches.iter().find(|b| std::ptr::eq(b.table, table))
    }

    /// The value of `field` in the row whose first tags are `tags`.
    fn value(batches: &[Batch], table_def: &TableDef, tags: &[&str], field: &str) -> Option<f64> {
        let batch = table(batches, table_def)?;
        let column = &batch.fields[table_def.field_index(field).expect("field exists")];
        let row = (0..batch.len()).find(|&r| {
            tags.iter().enumerate().all(|(t, want)| {
                let c = &batch.tags[t];
                c.dict[c.codes[r] as usize] == *want
            })
        })?;
        column.is_valid(row).then(|| match &column.values {
            Values::F64(v) => v[row],
            Values::I64(v) => v[row] as f64,
            Values::U64(v) => v[row] as f64,
        })
    }

    #[test]
    fn a_lost_gpu_is_reported_and_the_others_go_on() {
        let mut gpu = simulated(&["training", "gpu-lost", "training"]);
        let batches = gpu.collect(1_000_000).unwrap();
        let rows = table(&batches, &GPU).unwrap();
        assert_eq!(rows.tags[0].dict, vec!["0", "2"], "GPU 1 has no sample row");
        assert_eq!(value(&batches, &HEALTH, &["1"], "up"), Some(0.0));
        assert_eq!(value(&batches, &HEALTH, &["2"], "up"), Some(1.0));
        assert_eq!(
            value(&batches, &XID, &["1", &gpu.gpus[1].uuid, "79"], "errors"),
            Some(1.0)
        );
        let events = table(&batches, &EVENT).unwrap();
        let kinds: Vec<&str> = events.tags[2]
            .codes
            .iter()
            .map(|&c| events.tags[2].dict[c as usize].as_str())
            .collect();
        assert_eq!(kinds, vec!["lost", "xid"]);
        // The info row stays, so the operator knows which board to pull.
        assert_eq!(table(&batches, &INFO).unwrap().len(), 3);
        assert!(gpu
            .problems()
            .iter()
            .any(|p| p.contains("GPU 1") && p.contains("lost")));

        // The next tick: still down, counted, but no second "lost" event.
        let batches = gpu.collect(2_000_000).unwrap();
        assert_eq!(value(&batches, &HEALTH, &["1"], "sample_errors"), Some(2.0));
        assert!(table(&batches, &EVENT).is_none());
    }

    #[test]
    fn scenarios_show_in_the_metrics_that_reveal_them() {
        let mut gpu = simulated(&[
            "training",
            "thermal-throttle",
            "pcie-degraded",
            "nvlink-hidden",
            "power-throttle",
        ]);
        gpu.collect(0).unwrap();
        // The replay counter is a slow read: the tick of its second read.
        let b = gpu.collect(30_000_000).unwrap();
        // Training: HBM bytes/s is the DRAM ratio times the H100's 3.35 TB/s peak.
        let ratio = value(&b, &GPU, &["0"], "dram_bandwidth_ratio").unwrap();
        let hbm = value(&b, &GPU, &["0"], "hbm_bytes_per_second").unwrap();
        assert!((hbm - ratio * 3.35232e12).abs() < 1e6, "{hbm} vs {ratio}");
        assert_eq!(value(&b, &GPU, &["0"], "clock_event_reasons"), Some(0.0));
        // Thermal: both thermal reasons, and the SM clock below its maximum.
        let uuid1 = gpu.gpus[1].uuid.clone();
        for reason in ["sw_thermal_slowdown", "hw_thermal_slowdown"] {
            assert_eq!(
                value(&b, &CLOCK_EVENT, &["1", &uuid1, reason], "active"),
                Some(1.0)
            );
        }
        assert_eq!(
            value(&b, &CLOCK_EVENT, &["1", &uuid1, "sw_power_cap"], "active"),
            Some(0.0)
        );
        assert!(
            value(&b, &GPU, &["1"], "sm_clock_hertz")
                < value(&b, &GPU, &["1"], "sm_clock_max_hertz")
        );
        // PCIe trained down under load, and replays counting.
        assert_eq!(value(&b, &GPU, &["2"], "pcie_link_gen"), Some(3.0));
        assert_eq!(value(&b, &GPU, &["2"], "pcie_link_width"), Some(8.0));
        assert!(value(&b, &GPU, &["2"], "pcie_replays").unwrap() > 0.0);
        // NVLink hidden: 0 links up of the product's 18, passthrough.
        assert_eq!(value(&b, &GPU, &["3"], "nvlink_links_up"), Some(0.0));
        assert_eq!(value(&b, &GPU, &["3"], "nvlink_links_product"), Some(18.0));
        assert_eq!(
            value(&b, &GPU, &["3"], "nvlink_total_rx_bytes_per_second"),
            None
        );
        // Power: at the limit with the power-cap reason.
        assert_eq!(
            value(&b, &GPU, &["4"], "power_watts"),
            value(&b, &GPU, &["4"], "power_limit_watts")
        );
        let problems = gpu.problems().join("\n");
        for needle in [
            "GPU 1 (",
            "sw_thermal_slowdown",
            "Gen3 x8 under load",
            "0 of 18 NVLink links up",
            "sw_power_cap",
        ] {
            assert!(problems.contains(needle), "{needle} in:\n{problems}");
        }
        assert!(
            !problems.contains("GPU 0 ("),
            "a healthy GPU has no problem:\n{problems}"
        );
    }

    /// Every counter series of `batches` as (table, tags, field) → value.
    fn counters(batches: &[Batch]) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for b in batches.iter().filter(|b| b.table.exported) {
            for (f, field) in b.table.fields.iter().enumerate() {
                if field.kind != vtax_store::MetricKind::Counter {
                    continue;
                }
                for row in (0..b.len()).filter(|&r| b.fields[f].is_valid(r)) {
                    let tags: Vec<&str> = b
                        .tags
                        .iter()
                        .map(|c| c.dict[c.codes[row] as usize].as_str())
                        .collect();
                    let v = match &b.fields[f].values {
                        Values::F64(v) => v[row],
                        Values::I64(v) => v[row] as f64,
                        Values::U64(v) => v[row] as f64,
                    };
                    out.insert(format!("{} {tags:?} {}", b.table.name, field.name), v);
                }
            }
        }
        out
    }

    /// A reload that changes the collector's settings builds it anew; the
    /// new one carries on the counts of the old, so none goes back or
    /// leaves (an XID counter once fell from 6 to 1 on SIGHUP).
    #[test]
    fn a_rebuilt_collector_takes_over_the_counts_of_the_old() {
        let mut old = simulated(&["xid", "gpu-lost", "training"]);
        old.collect(1_000_000).unwrap();
        let before = counters(&old.collect(122_000_000).unwrap());
        assert_eq!(
            before
                .iter()
                .filter(|(k, _)| k.starts_with("gpu_xid "))
                .count(),
            3,
            "31 and 13 on GPU 0, 79 on GPU 1: {before:?}"
        );
        let roots = Roots {
            procfs: "/nonexistent/proc".into(),
            sysfs: "/nonexistent/sys".into(),
            ..Roots::default()
        };
        // The same backend settings (the backend goes on), then other ones
        // (a new simulator, whose clock starts again).
        let changes: [fn(&mut GpuConfig); 2] = [
            |c| c.processes = false,
            |c| c.simulate_profile = "h200".into(),
        ];
        for change in changes {
            let mut config = old.config.clone();
            change(&mut config);
            let mut new = Gpu::new(&config, &roots);
            new.take_over(Box::new(old));
            assert!(matches!(new.probe(), Availability::Available(_)));
            let after = counters(&new.collect(123_000_000).unwrap());
            for (series, value) in &before {
                let now = after.get(series);
                // The driver's own counters, which a new simulator starts
                // again as a reloaded driver would.
                let kept_by_the_backend =
                    series.starts_with("gpu ") || series.starts_with("gpu_nvlink ");
                if kept_by_the_backend && config.simulate_profile == "h200" {
                    continue;
                }
                assert!(
                    now.is_some_and(|now| now >= value),
                    "{series}: {value} before, {now:?} after ({config:?})"
                );
            }
            old = new;
        }
    }

    /// Simulated GPUs with the collector's settings changed by `change`.
    fn simulated_with(scenarios: &[&str], change: impl FnOnce(&mut GpuConfig)) -> Gpu {
        let mut config = GpuConfig {
            simulate_gpus: scenarios.len() as u32,
            simulate_scenarios: scenarios.iter().map(|s| s.to_string()).collect(),
            ..GpuConfig::default()
        };
        change(&mut config);
        let roots = Roots {
            procfs: "/nonexistent/proc".into(),
            sysfs: "/nonexistent/sys".into(),
            ..Roots::default()
        };
        let mut gpu = Gpu::new(&config, &roots);
        assert!(matches!(gpu.probe(), Availability::Available(_)));
        gpu
    }

    /// The simulated training GPU draws 615 + 25 sin(2πt/60 + i) W and its
    /// counter is that power's exact integral. Read every 30 s and
    /// integrated by 1 s trapezoids in between, the exported counter must be
    /// the exact one at each exact read (or, where the integration ran
    /// ahead, hold above it by no more than that error), never go back, and
    /// stay within the trapezoid's bound in between: L Δt² max|P''| / 12 =
    /// 30 s × (1 s)² × 25 W × (2π/60 s)² / 12 = 0.69 J.
    #[test]
    fn energy_is_exact_at_each_exact_read_and_within_the_bound_between() {
        let scenarios = ["training", "memory-bound", "idle", "training"];
        let mut spaced = simulated(&scenarios);
        let mut exact = simulated_with(&scenarios, |c| c.energy_interval_secs = 0.0);
        let omega = std::f64::consts::TAU / sim::WOBBLE_PERIOD_SECONDS;
        let bound = DEFAULT_ENERGY_INTERVAL_SECS * 25.0 * omega * omega / 12.0;
        let mut before: Vec<Option<f64>> = vec![None; scenarios.len()];
        let (mut exact_reads, mut held, mut largest_gap) = (0, 0, 0.0f64);
        // Ticks a second apart, each a little late, as a loaded node's are.
        for second in 0..=300i64 {
            let time_us = 1_000_000 * second + 7_000 * (second % 3);
            let a = spaced.collect(time_us).unwrap();
            let b = exact.collect(time_us).unwrap();
            for (gpu, previous) in before.iter_mut().enumerate() {
                let gpu = gpu.to_string();
                let get = |batches, field| value(batches, &GPU, &[&gpu], field).unwrap();
                let (ours, truth) = (get(&a, "energy_joules"), get(&b, "energy_joules"));
                assert_eq!(get(&b, "energy_exact_age_seconds"), 0.0);
                if let Some(previous) = *previous {
                    assert!(
                        ours >= previous,
                        "GPU {gpu} at {second} s: {ours} after {previous}"
                    );
                }
                if get(&a, "energy_exact_age_seconds") == 0.0 {
                    exact_reads += 1;
                    if ours != truth {
                        // Held where the integration ran ahead of the counter.
                        held += 1;
                        assert_eq!(Some(ours), *previous, "GPU {gpu} at {second} s");
                        assert!(ours > truth && ours - truth <= bound, "{ours} vs {truth}");
                    }
                } else {
                    assert!(get(&a, "energy_exact_age_seconds") < 31.0);
                }
                largest_gap = largest_gap.max((ours - truth).abs());
                assert!(
                    (ours - truth).abs() <= bound,
                    "GPU {gpu} at {second} s: {ours} against the exact {truth}, bound {bound} J"
                );
                *previous = Some(ours);
            }
        }
        // 0, 30, ..., 300 s on each of the four GPUs.
        assert_eq!(exact_reads, 11 * scenarios.len());
        assert!(held < exact_reads, "most exact reads are met exactly");
        // A wrong rule (a rectangle, or the power not integrated) is off by
        // tens to thousands of joules: the comparison is not vacuous.
        assert!(largest_gap > 0.0 && largest_gap <= bound, "{largest_gap}");
        let errors = value(
            &spaced.collect(301_000_000).unwrap(),
            &GPU,
            &["0"],
            "energy_integration_error_joules",
        )
        .unwrap();
        assert!(errors.abs() <= bound, "{errors}");
    }

    /// A reload hands the integrated counter to the new collector: it does
    /// not read the exact counter again at once, nor start over.
    #[test]
    fn the_energy_counter_carries_over_a_reload() {
        let mut old = simulated(&["training"]);
        let mut last = 0.0;
        for second in 0..12 {
            let b = old.collect(second * 1_000_000).unwrap();
            last = value(&b, &GPU, &["0"], "energy_joules").unwrap();
        }
        let config = GpuConfig {
            processes: false,
            ..old.config.clone()
        };
        let mut new = Gpu::new(&config, &Roots::default());
        new.take_over(Box::new(old));
        assert!(matches!(new.probe(), Availability::Available(_)));
        let b = new.collect(12_000_000).unwrap();
        assert_eq!(
            value(&b, &GPU, &["0"], "energy_exact_age_seconds"),
            Some(12.0)
        );
        let now = value(&b, &GPU, &["0"], "energy_joules").unwrap();
        assert!(now > last && now - last < 700.0, "{last} then {now}");
    }

    /// The shares of each GPU's processes at `batches`, by pid.
    fn shares(batches: &[Batch], gpu: &str) -> BTreeMap<String, (Option<f64>, Option<f64>)> {
        let Some(b) = table(batches, &PROCESS) else {
            return BTreeMap::new();
        };
        let f = |name| match &b.fields[PROCESS.field_index(name).unwrap()].values {
            Values::F64(v) => v.clone(),
            _ => unreachable!("f64"),
        };
        let valid = |name, row| b.fields[PROCESS.field_index(name).unwrap()].is_valid(row);
        let (sm, memory) = (f("sm_utilization_ratio"), f("memory_utilization_ratio"));
        let tag = |t: usize, row: usize| b.tags[t].dict[b.tags[t].codes[row] as usize].clone();
        (0..b.len())
            .filter(|&row| tag(0, row) == gpu)
            .map(|row| {
                (
                    tag(2, row),
                    (
                        valid("sm_utilization_ratio", row).then_some(sm[row]),
                        valid("memory_utilization_ratio", row).then_some(memory[row]),
                    ),
                )
            })
            .collect()
    }

    /// Wraps a backend, keeping each sample's plan and whether the shares
    /// were read.
    struct Plans {
        inner: Box<dyn GpuBackend>,
        seen: Seen,
    }

    /// Each sample's GPU, plan, and whether the shares were read.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<(u32, ReadPlan, bool)>>>;

    impl GpuBackend for Plans {
        fn kind(&self) -> &'static str {
            "plans"
        }
        fn driver_version(&self) -> String {
            self.inner.driver_version()
        }
        fn identities(&mut self) -> Result<Vec<GpuIdentity>, String> {
            self.inner.identities()
        }
        fn sample(
            &mut self,
            gpu: &GpuIdentity,
            time_us: i64,
            plan: ReadPlan,
        ) -> Result<GpuSample, SampleError> {
            let s = self.inner.sample(gpu, time_us, plan)?;
            let mut seen = self.seen.lock().unwrap();
            seen.push((gpu.index, plan, s.process_shares_read));
            Ok(s)
        }
        fn take_xids(&mut self) -> Vec<backend::XidEvent> {
            self.inner.take_xids()
        }
    }

    /// The collector with its backend wrapped in [`Plans`].
    fn with_plans(mut gpu: Gpu) -> (Gpu, Seen) {
        let seen = std::sync::Arc::default();
        gpu.backend = Some(Box::new(Plans {
            inner: gpu.backend.take().expect("probed"),
            seen: std::sync::Arc::clone(&seen),
        }));
        (gpu, seen)
    }

    #[test]
    fn shared_gpus_read_shares_on_their_cadence_and_hold_them_between() {
        // GPU 0: one training process; GPU 1: MIG, three processes.
        let (mut gpu, seen) = with_plans(simulated(&["training", "mig"]));
        let mut read_at = BTreeMap::new();
        for second in 0..25 {
            let b = gpu.collect(second * 1_000_000).unwrap();
            let (one, mig) = (shares(&b, "0"), shares(&b, "1"));
            // The lone process has the GPU's utilisation, fresh each tick.
            let utilization = value(&b, &GPU, &["0"], "utilization_ratio");
            assert_eq!(one.len(), 1);
            assert_eq!(one.values().next().unwrap().0, utilization);
            assert_eq!(mig.len(), 3);
            assert!(mig
                .values()
                .all(|(sm, memory)| sm.is_some() && memory.is_some()));
            let reads = seen.lock().unwrap();
            let (_, _, read) = *reads.iter().rev().find(|(i, _, _)| *i == 1).unwrap();
            if read {
                read_at.insert(second, mig);
            } else {
                let (_, last) = read_at.iter().next_back().expect("read at 0 s");
                assert_eq!(&mig, last, "held at {second} s");
            }
        }
        assert_eq!(read_at.keys().copied().collect::<Vec<_>>(), [0, 10, 20]);
        // The shares did move between reads (so holding them is seen).
        assert_ne!(read_at[&0], read_at[&10]);
        let reads = seen.lock().unwrap();
        assert!(
            reads
                .iter()
                .filter(|(i, _, _)| *i == 0)
                .all(|(_, _, read)| !read),
            "a lone process's shares never need the driver"
        );
    }

    #[test]
    fn every_read_every_tick_when_asked() {
        let (mut gpu, seen) = with_plans(simulated_with(&["training"], |c| {
            c.energy_interval_secs = 0.0;
            c.process_shares_interval_secs = 0.0;
            c.slow_reads_interval_secs = 0.0;
            c.single_process_shares_from_utilization = false;
        }));
        for second in 0..5 {
            let b = gpu.collect(second * 1_000_000).unwrap();
            assert_eq!(
                value(&b, &GPU, &["0"], "energy_exact_age_seconds"),
                Some(0.0)
            );
        }
        let reads = seen.lock().unwrap();
        assert_eq!(reads.len(), 5);
        // Every read, with the MIG mode of the tick before carried along.
        assert!(reads.iter().enumerate().all(|(tick, (_, plan, read))| {
            *plan
                == ReadPlan {
                    mig_enabled: (tick > 0).then_some(false),
                    ..ReadPlan::ALL
                }
                && *read
        }));
        // And none with processes off.
        let (mut gpu, seen) = with_plans(simulated_with(&["mig"], |c| c.processes = false));
        gpu.collect(0).unwrap();
        assert!(seen.lock().unwrap().iter().all(|(_, _, read)| !read));
    }

    /// Simulated GPUs (settings changed by `change`) on a simulator that
    /// `sim` sets up, and the simulator's count of its reads.
    fn simulated_counting(
        scenarios: &[&str],
        change: impl FnOnce(&mut GpuConfig),
        sim: impl FnOnce(sim::SimBackend) -> sim::SimBackend,
    ) -> (Gpu, sim::ReadCounts) {
        let mut gpu = simulated_with(scenarios, change);
        let played = scenarios
            .iter()
            .map(|s| sim::Scenario::parse(s).expect("a scenario"))
            .collect();
        let backend = sim(sim::SimBackend::new(
            scenarios.len() as u32,
            sim::PROFILES[0],
            played,
        ));
        let counts = backend.read_counts();
        gpu.backend = Some(Box::new(backend));
        (gpu, counts)
    }

    /// How many times the simulator made `read`.
    fn reads_of(counts: &sim::ReadCounts, read: &str) -> u64 {
        counts.lock().unwrap().get(read).copied().unwrap_or(0)
    }

    /// Tag `tag` of GPU `gpu`'s info row.
    fn info_tag(batches: &[Batch], gpu: &str, tag: &str) -> String {
        let b = table(batches, &INFO).expect("info rows");
        let t = INFO.tags.iter().position(|t| t.name == tag).expect("a tag");
        let row = (0..b.len())
            .find(|&r| b.tags[0].dict[b.tags[0].codes[r] as usize] == gpu)
            .expect("the GPU's row");
        b.tags[t].dict[b.tags[t].codes[row] as usize].clone()
    }

    /// The fields of the `gpu` row that come from the slow reads.
    const SLOW_FIELDS: [&str; 8] = [
        "power_limit_watts",
        "ecc_corrected_errors",
        "ecc_uncorrected_errors",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapping_pending",
        "remapping_failed",
        "pcie_replays",
    ];

    #[test]
    fn slow_reads_are_made_once_per_interval_and_held_between() {
        // GPU 0's replays grow 3 a second, GPU 1's corrected ECC errors one
        // every 10 s; GPU 2 has its NVLink links up with their rates moving.
        let scenarios = ["pcie-degraded", "xid", "training"];
        let (mut spaced, counts) = simulated_counting(&scenarios, |_| {}, |s| s);
        let (mut every, every_counts) =
            simulated_counting(&scenarios, |c| c.slow_reads_interval_secs = 0.0, |s| s);
        let mut read_at: Vec<i64> = Vec::new();
        let mut last_read: BTreeMap<(usize, &str), Option<f64>> = BTreeMap::new();
        for second in 0..=95i64 {
            // A little late now and then, as a loaded node's ticks are.
            let time_us = 1_000_000 * second + 7_000 * (second % 3);
            let reads_before = reads_of(&counts, "pcie_replay_counter");
            let a = spaced.collect(time_us).unwrap();
            let b = every.collect(time_us).unwrap();
            let read_now = reads_of(&counts, "pcie_replay_counter") > reads_before;
            if read_now {
                read_at.push(second);
            }
            for gpu in 0..scenarios.len() {
                let index = gpu.to_string();
                for field in SLOW_FIELDS {
                    let ours = value(&a, &GPU, &[&index], field);
                    let truth = value(&b, &GPU, &[&index], field);
                    assert!(ours.is_some(), "{field} of GPU {gpu} null at {second} s");
                    if read_now {
                        assert_eq!(ours, truth, "{field} of GPU {gpu} at {second} s");
                        last_read.insert((gpu, field), truth);
                    } else {
                        assert_eq!(
                            Some(&ours),
                            last_read.get(&(gpu, field)),
                            "{field} of GPU {gpu} held at {second} s"
                        );
                    }
                }
                for tag in ["virtualization_mode", "mig"] {
                    assert_eq!(info_tag(&a, &index, tag), info_tag(&b, &index, tag));
                }
                // Each tick's own values stay fresh.
                for field in ["power_watts", "pcie_link_gen", "nvlink_links_up"] {
                    assert_eq!(
                        value(&a, &GPU, &[&index], field),
                        value(&b, &GPU, &[&index], field),
                        "{field} of GPU {gpu} at {second} s"
                    );
                }
            }
            // The links of GPU 2 keep their rows, state and counters, with
            // this tick's rates.
            let uuid = spaced.gpus[2].uuid.clone();
            for link in ["0", "17"] {
                for field in [
                    "up",
                    "rx_bytes_per_second",
                    "tx_bytes_per_second",
                    "crc_errors",
                ] {
                    let ours = value(&a, &NVLINK, &["2", &uuid, link], field);
                    assert!(ours.is_some(), "link {link} {field} at {second} s");
                    assert_eq!(ours, value(&b, &NVLINK, &["2", &uuid, link], field));
                }
            }
            assert_eq!(
                table(&a, &NVLINK).map(Batch::len),
                table(&b, &NVLINK).map(Batch::len)
            );
        }
        assert_eq!(read_at, [0, 30, 60, 90]);
        // Once per interval on each GPU, every slow read; the rest each tick.
        for read in costs::SLOW {
            assert_eq!(reads_of(&counts, read), 4 * 3, "{read}");
            assert_eq!(reads_of(&every_counts, read), 96 * 3, "{read}");
        }
        for read in costs::EVERY_TICK {
            assert_eq!(reads_of(&counts, read), 96 * 3, "{read}");
        }
        // The values did change between reads, so holding them was seen.
        assert_eq!(
            last_read[&(0, "pcie_replays")],
            Some(270.0),
            "read at 90 s: 3 a second"
        );
        let ecc = last_read[&(1, "ecc_corrected_errors")];
        assert_eq!(ecc, Some(9.0), "read at 90 s: one every 10 s");
    }

    #[test]
    fn a_change_shows_at_the_next_slow_read() {
        // MIG turned on at 40 s on GPU 0.
        let (mut gpu, counts) = simulated_counting(
            &["training", "pcie-degraded"],
            |_| {},
            |s| s.turning(0, 40.0, sim::Scenario::Mig),
        );
        for second in 0..=65i64 {
            let b = gpu.collect(second * 1_000_000).unwrap();
            let mig = info_tag(&b, "0", "mig");
            let instances = table(&b, &MIG).map_or(0, Batch::len);
            if second < 60 {
                assert_eq!(mig, "off", "at {second} s");
                assert_eq!(instances, 0, "at {second} s");
            } else {
                assert_eq!(mig, "on", "at {second} s");
                assert_eq!(instances, 3, "at {second} s");
            }
            // The replay counter grows 3 a second; it shows 3 × the last
            // slow read's second.
            let read = second / 30 * 30;
            assert_eq!(
                value(&b, &GPU, &["1"], "pcie_replays"),
                Some((read * 3) as f64),
                "at {second} s"
            );
        }
        assert_eq!(reads_of(&counts, "mig_mode"), 3 * 2);
        assert!(reads_of(&counts, "mig instances") > 0);
    }

    #[test]
    fn a_gpu_that_answers_again_is_read_in_full() {
        // GPU 0 falls off the bus from 10 s to 20 s.
        let (mut gpu, counts) = simulated_counting(
            &["training"],
            |_| {},
            |s| {
                s.turning(0, 10.0, sim::Scenario::Lost)
                    .turning(0, 20.0, sim::Scenario::Training)
            },
        );
        for second in 0..20 {
            gpu.collect(second * 1_000_000).unwrap();
        }
        assert_eq!(reads_of(&counts, "mig_mode"), 1, "the first tick only");
        let exact_before = reads_of(&counts, "total_energy_consumption");
        let b = gpu.collect(20_000_000).unwrap();
        assert_eq!(value(&b, &HEALTH, &["0"], "up"), Some(1.0));
        assert_eq!(
            reads_of(&counts, "mig_mode"),
            2,
            "read again when it answers"
        );
        assert_eq!(
            reads_of(&counts, "total_energy_consumption"),
            exact_before + 1
        );
        assert_eq!(
            value(&b, &GPU, &["0"], "energy_exact_age_seconds"),
            Some(0.0)
        );
        // And then on its cadence from there: 50 s, not 30 s.
        for second in 21..50 {
            gpu.collect(second * 1_000_000).unwrap();
        }
        assert_eq!(reads_of(&counts, "mig_mode"), 2);
        gpu.collect(50_000_000).unwrap();
        assert_eq!(reads_of(&counts, "mig_mode"), 3);
    }

    /// A reload hands the values of the last slow read to the new collector:
    /// it neither reads them again at once nor exports them null or reset.
    #[test]
    fn slow_values_carry_over_a_reload() {
        let (mut old, counts) = simulated_counting(&["pcie-degraded", "mig"], |_| {}, |s| s);
        for second in 0..=40 {
            old.collect(second * 1_000_000).unwrap();
        }
        assert_eq!(reads_of(&counts, "pcie_replay_counter"), 2 * 2);
        let config = GpuConfig {
            processes: false,
            ..old.config.clone()
        };
        let mut new = Gpu::new(&config, &Roots::default());
        new.take_over(Box::new(old));
        assert!(matches!(new.probe(), Availability::Available(_)));
        let b = new.collect(41_000_000).unwrap();
        assert_eq!(reads_of(&counts, "pcie_replay_counter"), 2 * 2);
        assert_eq!(value(&b, &GPU, &["0"], "pcie_replays"), Some(90.0));
        assert_eq!(value(&b, &GPU, &["0"], "power_limit_watts"), Some(700.0));
        assert_eq!(info_tag(&b, "1", "mig"), "on");
        assert_eq!(table(&b, &MIG).map(Batch::len), Some(3));
        let b = new.collect(60_000_000).unwrap();
        assert_eq!(reads_of(&counts, "pcie_replay_counter"), 3 * 2);
        assert_eq!(value(&b, &GPU, &["0"], "pcie_replays"), Some(180.0));
    }

    #[test]
    fn counters_are_monotonic_across_ticks() {
        let mut gpu = simulated(&["xid"]);
        let a = gpu.collect(0).unwrap();
        let b = gpu.collect(61_000_000).unwrap();
        for field in ["energy_joules", "ecc_corrected_errors"] {
            assert!(
                value(&b, &GPU, &["0"], field) > value(&a, &GPU, &["0"], field),
                "{field}"
            );
        }
        let uuid = gpu.gpus[0].uuid.clone();
        assert_eq!(value(&b, &XID, &["0", &uuid, "31"], "errors"), Some(1.0));
        assert_eq!(value(&b, &XID, &["0", &uuid, "13"], "errors"), Some(1.0));
        assert_eq!(value(&b, &HEALTH, &["0"], "last_xid"), Some(13.0));
    }

    #[test]
    fn mig_instances_are_rows_of_their_own() {
        let mut gpu = simulated(&["mig"]);
        let b = gpu.collect(0).unwrap();
        let mig = table(&b, &MIG).unwrap();
        assert_eq!(mig.len(), 3);
        assert_eq!(mig.tags[4].dict, vec!["3g.40gb", "2g.20gb", "1g.10gb"]);
        let processes = table(&b, &PROCESS).unwrap();
        assert_eq!(processes.len(), 3, "one process per instance");
    }

    #[test]
    fn without_a_driver_the_collector_is_off_with_the_reason() {
        let mut gpu = Gpu::new(&GpuConfig::default(), &Roots::default());
        // CI has no driver; on a GPU machine the same probe must find NVML.
        match (nvml::load(), gpu.probe()) {
            (Err(_), Availability::Absent(reason)) => {
                assert!(reason.contains("libnvidia-ml"), "{reason}")
            }
            (Ok(_), Availability::Available(found)) => assert!(found.contains("nvml"), "{found}"),
            (Ok(_), Availability::Absent(reason)) => {
                assert!(reason.contains("sees no GPU"), "{reason}")
            }
            (Err(e), Availability::Available(found)) => panic!("found {found} without NVML: {e}"),
            (_, Availability::Failed(reason)) => panic!("a driver read failed: {reason}"),
        }
    }
}
