//! The NVML backend, through `nvml-wrapper`, which loads `libnvidia-ml.so.1`
//! at run time: the agent builds and starts on machines with no driver, and
//! the collector is off there with the loader's reason.
//!
//! GPM (Hopper and newer) gives SM activity, occupancy, tensor activity, DRAM
//! bandwidth and per-link NVLink throughput from two samples of the GPU's
//! counters, a tick apart. It does not take the profiling lock that DCGM's
//! profiling fields take, so it stays on while someone runs Nsight.
//!
//! XID errors arrive on an NVML event set, waited on by a thread of its own
//! so a tick never blocks on the driver's event queue.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, GpuVirtualizationMode, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{gpm_metrics_get, GpmSample};
use nvml_wrapper::struct_wrappers::device::{FieldValueSample, ProcessInfo};
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::structs::device::{FieldId, MigMode};
use nvml_wrapper::{Device, EventSet, Nvml};

use super::backend::{
    is_quiet, nvlink_links_of_product, unread_uuid, GpmMetrics, GpuBackend, GpuIdentity,
    GpuSample, LinkSample, MigSample, ProcessSample, ReadPlan, ReadTime, SampleError,
    VirtualizationMode, XidEvent,
};
use super::nvml_fallback::{self, ProcessList};
use crate::jitter::thread_cpu_ns;
use crate::ticks::now_us;

/// The comm of NVIDIA's MPS server, `nvidia-cuda-mps-server`: the kernel
/// keeps 15 characters of a name.
const MPS_SERVER_COMM: &str = "nvidia-cuda-mps";

/// NVML's field id of the HBM temperature.
const FIELD_MEMORY_TEMPERATURE: u32 = 82;
/// NVML has at most this many NVLink links per GPU.
const NVLINK_MAX_LINKS: u32 = 18;
const MIB: f64 = 1024.0 * 1024.0;

/// The library, loaded once and kept for the process: GPM samples and event
/// sets borrow it, and loading it again on each config reload gains nothing.
static NVML: Mutex<Option<&'static Nvml>> = Mutex::new(None);

/// Loads NVML, or says why not (no library, no driver loaded).
pub fn load() -> Result<&'static Nvml, String> {
    load_naming_versions(Path::new("/proc"))
}

/// [`load`], where a kernel driver and library of different versions are
/// named by their versions, the kernel module's read under `procfs`.
pub fn load_naming_versions(procfs: &Path) -> Result<&'static Nvml, String> {
    let mut slot = NVML.lock().expect("not poisoned");
    if let Some(nvml) = *slot {
        return Ok(nvml);
    }
    match Nvml::init() {
        Ok(nvml) => {
            let nvml: &'static Nvml = Box::leak(Box::new(nvml));
            *slot = Some(nvml);
            Ok(nvml)
        }
        Err(NvmlError::LibloadingError(e)) => Err(format!(
            "no NVIDIA driver: libnvidia-ml.so.1 could not be loaded ({e})"
        )),
        // The two an operator meets most, with what mends them.
        Err(NvmlError::LibRmVersionMismatch) => Err(format!(
            "NVML did not initialise: the loaded NVIDIA kernel driver and libnvidia-ml.so.1 are \
             of different versions{}, as after a driver upgrade without a reboot; reboot the \
             node (or unload and load the nvidia modules)",
            versions_apart(kernel_module_version(procfs), library_version())
        )),
        Err(NvmlError::DriverNotLoaded) => Err(
            "NVML did not initialise: the NVIDIA kernel driver is not loaded (modprobe nvidia; \
             dmesg says why it did not load)"
                .into(),
        ),
        Err(e) => Err(format!("NVML did not initialise: {e}")),
    }
}

/// The versions of a mismatch, as far as they are known: " (kernel module
/// 580.95.05, library 580.159.04)", or nothing.
fn versions_apart(kernel_module: Option<String>, library: Option<String>) -> String {
    let known: Vec<String> = [("kernel module", kernel_module), ("library", library)]
        .into_iter()
        .filter_map(|(what, version)| Some(format!("{what} {}", version?)))
        .collect();
    if known.is_empty() {
        String::new()
    } else {
        format!(" ({})", known.join(", "))
    }
}

/// A driver version as NVIDIA writes it: digits in two or more parts
/// (`580.95.05`, `470.256`).
fn is_driver_version(text: &str) -> bool {
    text.split('.').count() >= 2
        && text
            .split('.')
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

/// The loaded kernel module's version, from `driver/nvidia/version`: "NVRM
/// version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 ...",
/// or "... Open Kernel Module for x86_64  580.95.05  Release Build ...".
fn kernel_module_version(procfs: &Path) -> Option<String> {
    let text = std::fs::read_to_string(procfs.join("driver/nvidia/version")).ok()?;
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|word| is_driver_version(word))
        .map(str::to_owned)
}

/// The version of the library the loader takes for libnvidia-ml.so.1: the
/// name of the file it maps (libnvidia-ml.so.580.159.04; the .so.1 is a
/// link to it). NVML unloads the library again when its init fails, so it
/// is opened once more here, only to see which file that is.
fn library_version() -> Option<String> {
    // SAFETY: the library NVML itself was just loaded from; nothing of it
    // is called, and it is closed at the end of this function.
    let _library = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.ok()?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find_map(|path| {
            let name = Path::new(path).file_name()?.to_str()?;
            let version = name.strip_prefix("libnvidia-ml.so.")?;
            is_driver_version(version).then(|| version.to_owned())
        })
}

/// GPM's GPU-wide metrics, in the order [`NvmlBackend::gpm`] reads them.
const GPM_GPU_WIDE: [GpmMetricId; 8] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::PcieRxPerSec,
    GpmMetricId::PcieTxPerSec,
    GpmMetricId::NvlinkTotalRxPerSec,
    GpmMetricId::NvlinkTotalTxPerSec,
];

/// GPM's (rx, tx) metrics of each NVLink link, by link number.
const GPM_PER_LINK: [(GpmMetricId, GpmMetricId); NVLINK_MAX_LINKS as usize] = {
    use GpmMetricId::*;
    [
        (NvlinkL0RxPerSec, NvlinkL0TxPerSec),
        (NvlinkL1RxPerSec, NvlinkL1TxPerSec),
        (NvlinkL2RxPerSec, NvlinkL2TxPerSec),
        (NvlinkL3RxPerSec, NvlinkL3TxPerSec),
        (NvlinkL4RxPerSec, NvlinkL4TxPerSec),
        (NvlinkL5RxPerSec, NvlinkL5TxPerSec),
        (NvlinkL6RxPerSec, NvlinkL6TxPerSec),
        (NvlinkL7RxPerSec, NvlinkL7TxPerSec),
        (NvlinkL8RxPerSec, NvlinkL8TxPerSec),
        (NvlinkL9RxPerSec, NvlinkL9TxPerSec),
        (NvlinkL10RxPerSec, NvlinkL10TxPerSec),
        (NvlinkL11RxPerSec, NvlinkL11TxPerSec),
        (NvlinkL12RxPerSec, NvlinkL12TxPerSec),
        (NvlinkL13RxPerSec, NvlinkL13TxPerSec),
        (NvlinkL14RxPerSec, NvlinkL14TxPerSec),
        (NvlinkL15RxPerSec, NvlinkL15TxPerSec),
        (NvlinkL16RxPerSec, NvlinkL16TxPerSec),
        (NvlinkL17RxPerSec, NvlinkL17TxPerSec),
    ]
};

/// Every link number NVML may have.
const ALL_LINKS: [u32; NVLINK_MAX_LINKS as usize] = {
    let mut links = [0; NVLINK_MAX_LINKS as usize];
    let mut link = 0;
    while link < NVLINK_MAX_LINKS {
        links[link as usize] = link;
        link += 1;
    }
    links
};

/// What GPM is asked for a GPU: the GPU-wide metrics, then rx and tx of
/// each of `links`. Made at each link read, kept until the next.
///
/// A link's rates are kept only while it is up (the collector drops them
/// for a link that is down or hidden), and each per-link pair adds to what
/// the driver spends computing the metrics: on an idle H100 one second
/// apart, 0.30-0.36 ms with the GPU-wide eight, 0.43-0.45 ms with all 18
/// links' as well (docs/gpus.md, "what single NVML calls cost"). A GPU
/// whose links a hypervisor hides, or a PCIe product, asks for none.
struct GpmAsk {
    links: Vec<u32>,
    ids: Vec<GpmMetricId>,
}

impl GpmAsk {
    /// The ask for these links (those past the last link number left out).
    fn new(links: &[u32]) -> GpmAsk {
        let links: Vec<u32> = links
            .iter()
            .copied()
            .filter(|&l| l < NVLINK_MAX_LINKS)
            .collect();
        let mut ids = GPM_GPU_WIDE.to_vec();
        for &link in &links {
            let (rx, tx) = GPM_PER_LINK[link as usize];
            ids.extend([rx, tx]);
        }
        GpmAsk { links, ids }
    }
}

/// Each link's (rx, tx), by link number, from GPM's values for an ask of
/// `links` (per-link values follow the GPU-wide ones, rx then tx); links
/// not asked for have none.
fn per_link_rates(links: &[u32], value: impl Fn(usize) -> Option<f64>) -> Vec<LinkRates> {
    let mut rates = vec![(None, None); NVLINK_MAX_LINKS as usize];
    for (pair, &link) in links.iter().enumerate() {
        let at = GPM_GPU_WIDE.len() + 2 * pair;
        rates[link as usize] = (value(at), value(at + 1));
    }
    rates
}

/// NVML as a [`GpuBackend`].
pub struct NvmlBackend {
    nvml: &'static Nvml,
    use_gpm: bool,
    /// What GPM is asked for each GPU, by index: the rates of the links up
    /// at its last link read; every link's before the first.
    gpm_asks: HashMap<u32, GpmAsk>,
    /// The previous GPM sample of each GPU, by index.
    gpm_previous: HashMap<u32, GpmSample<'static>>,
    /// The last process-utilisation timestamp seen, by GPU index.
    process_seen_us: HashMap<u32, u64>,
    /// Where /proc is (`--path.procfs`).
    procfs: PathBuf,
    /// Whether each listed process may be an MPS server (its comm says so,
    /// or cannot be read), by GPU index and pid, for those of each GPU's
    /// last list.
    may_serve_mps: HashMap<(u32, u32), bool>,
    xids: Arc<Mutex<Vec<XidEvent>>>,
    xid_stop: Arc<AtomicBool>,
    xid_thread: Option<JoinHandle<()>>,
    /// Each GPU's last sample's read times, by index, once the doctor has
    /// turned timing on (`vtax doctor --gpu`); None: reads are not timed.
    read_times: Option<HashMap<u32, Vec<ReadTime>>>,
}

impl NvmlBackend {
    /// Loads NVML; `use_gpm` turns the GPM metrics on; processes are
    /// looked at under `procfs`.
    pub fn new(use_gpm: bool, procfs: &Path) -> Result<NvmlBackend, String> {
        let nvml = load_naming_versions(procfs)?;
        Ok(NvmlBackend {
            nvml,
            use_gpm,
            gpm_asks: HashMap::new(),
            gpm_previous: HashMap::new(),
            process_seen_us: HashMap::new(),
            procfs: procfs.to_path_buf(),
            may_serve_mps: HashMap::new(),
            xids: Arc::default(),
            xid_stop: Arc::default(),
            xid_thread: None,
            read_times: None,
        })
    }

    fn start_xid_thread(&mut self, count: u32) {
        if self.xid_thread.is_some() {
            return;
        }
        let (nvml, xids, stop) = (self.nvml, self.xids.clone(), self.xid_stop.clone());
        let spawned = std::thread::Builder::new()
            .name("gpu-xid".into())
            .spawn(move || xid_loop(nvml, count, &xids, &stop));
        match spawned {
            Ok(thread) => self.xid_thread = Some(thread),
            Err(e) => tracing::warn!(error = %e, "No XID thread: XID errors are not counted."),
        }
    }

    /// GPM metrics since the previous tick, and each link's (rx, tx) bytes/s.
    fn gpm(
        &mut self,
        index: u32,
        device: &Device<'static>,
    ) -> Option<(GpmMetrics, Vec<LinkRates>)> {
        let now = device.gpm_sample().ok()?;
        let previous = self.gpm_previous.insert(index, now)?;
        let now = self.gpm_previous.get(&index)?;
        let ask = self
            .gpm_asks
            .entry(index)
            .or_insert_with(|| GpmAsk::new(&ALL_LINKS));
        let results = gpm_metrics_get(self.nvml, &previous, now, &ask.ids).ok()?;
        let value = |i: usize| {
            results
                .get(i)
                .and_then(|r| r.as_ref().ok())
                .map(|r| r.value)
        };
        // Ratios come in percent, bandwidths in MiB/s.
        let percent = |i: usize| value(i).map(|v| v / 100.0);
        let mib = |i: usize| value(i).map(|v| v * MIB);
        let metrics = GpmMetrics {
            sm_active_ratio: percent(0),
            sm_occupancy_ratio: percent(1),
            tensor_active_ratio: percent(2),
            dram_bandwidth_ratio: percent(3),
            pcie_rx_bytes_per_second: mib(4),
            pcie_tx_bytes_per_second: mib(5),
            nvlink_rx_bytes_per_second: mib(6),
            nvlink_tx_bytes_per_second: mib(7),
        };
        Some((metrics, per_link_rates(&ask.links, mib)))
    }

    /// Links the GPU has: those NVML answers for, without rates (the
    /// collector puts each tick's GPM rates on them); keeps which are up.
    fn links(&mut self, index: u32, d: &Device<'static>) -> Vec<LinkSample> {
        let mut links = Vec::new();
        for link in 0..NVLINK_MAX_LINKS {
            let wrapper = d.link_wrapper_for(link);
            // NotSupported: the product has no such link, or the hypervisor hides it.
            let Ok(active) = wrapper.is_active() else {
                continue;
            };
            let counter = |c| active.then(|| wrapper.error_counter(c).ok()).flatten();
            links.push(LinkSample {
                link,
                active,
                rx_bytes_per_second: None,
                tx_bytes_per_second: None,
                crc_errors: counter(ErrorCounter::DlCrcFlit),
                replay_errors: counter(ErrorCounter::DlReplay),
                recovery_errors: counter(ErrorCounter::DlRecovery),
            });
        }
        let up: Vec<u32> = links.iter().filter(|l| l.active).map(|l| l.link).collect();
        self.gpm_asks.insert(index, GpmAsk::new(&up));
        links
    }

    /// Compute processes with their memory (under MPS with the server's
    /// clients, when the plan wants them), and, when the plan's
    /// `process_shares` says so for this many processes, their SM and
    /// memory shares since the last read; why the list could not be read
    /// (`None`: it was), and whether the shares were.
    fn processes(
        &mut self,
        index: u32,
        d: &Device<'static>,
        reads: &mut Reads,
        plan: ReadPlan,
        mig_enabled: Option<bool>,
    ) -> (Vec<ProcessSample>, Option<String>, bool) {
        let mut running = match reads.time("running_compute_processes", || {
            nvml_fallback::processes(self.nvml, d, ProcessList::Compute)
        }) {
            Ok(running) => running,
            Err(e) => return (Vec::new(), Some(e.to_string()), false),
        };
        // Under MPS the compute list names the server alone, which holds the
        // one context its clients share; the clients, the processes an
        // operator looks for, are on a list of their own, read only while a
        // listed process may be a server.
        let mut unlisted = None;
        if plan.mps_clients && self.lists_an_mps_server(index, &running) {
            match reads.time("mps_compute_processes", || {
                nvml_fallback::processes(self.nvml, d, ProcessList::Mps)
            }) {
                Ok(clients) => {
                    for client in clients {
                        if running.iter().all(|p| p.pid != client.pid) {
                            running.push(client);
                        }
                    }
                }
                // A driver without the list, or a GPU without MPS: the
                // doctor says the first; neither hides a client here.
                Err(e) if nvml_fallback::lacks_the_call(&e) => {}
                Err(NvmlError::NotSupported) => {}
                Err(e) => unlisted = Some(format!("its MPS clients: {e}")),
            }
        }
        // The shares cost the driver 2.5-5.8 ms of CPU on an H100 against
        // 0.02-0.1 ms for the list: on an idle GPU there is no one to share
        // out, and the collector spaces the reads out.
        let read_shares = plan
            .process_shares
            .calls_the_driver(running.len(), mig_enabled);
        let since = self.process_seen_us.get(&index).copied();
        let mut shares: HashMap<u32, (f64, f64)> = HashMap::new();
        let read = read_shares.then(|| {
            reads.time("process_utilization_stats", || {
                d.process_utilization_stats(since)
            })
        });
        // NVML gives a sample only for a process that used the GPU since
        // `since`, and NOT_FOUND when none did: a listed process without one
        // used none of it, a share of 0, not an unknown one. Not under MIG,
        // where per-process utilisation is reported unsupported (a footnote
        // of NVML's, not yet seen on a lent GPU): there no sample says
        // nothing.
        let shares_known = match read {
            Some(Ok(samples)) => {
                let mut newest = since.unwrap_or(0);
                for s in samples {
                    newest = newest.max(s.timestamp);
                    shares.insert(
                        s.pid,
                        (f64::from(s.sm_util) / 100.0, f64::from(s.mem_util) / 100.0),
                    );
                }
                self.process_seen_us.insert(index, newest);
                true
            }
            Some(Err(NvmlError::NotFound)) => true,
            _ => false,
        };
        let idle = (shares_known && mig_enabled == Some(false)).then_some((0.0, 0.0));
        let processes = running
            .into_iter()
            .map(|p| {
                let share = shares.get(&p.pid).copied().or(idle);
                ProcessSample {
                    pid: p.pid,
                    used_memory_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => Some(bytes),
                        UsedGpuMemory::Unavailable => None,
                    },
                    sm_utilization_ratio: share.map(|s| s.0),
                    memory_utilization_ratio: share.map(|s| s.1),
                    gpu_instance: p.gpu_instance_id,
                }
            })
            .collect();
        (processes, unlisted, read_shares)
    }

    /// Whether one of `running` may be an MPS server: its comm is the
    /// server's (`nvidia-cuda-mps-server`, cut to 15 characters), or cannot
    /// be read (the process is in another PID namespace, or gone). Each
    /// pid's comm is read once while it is listed.
    fn lists_an_mps_server(&mut self, index: u32, running: &[ProcessInfo]) -> bool {
        let procfs = &self.procfs;
        self.may_serve_mps
            .retain(|&(gpu, pid), _| gpu != index || running.iter().any(|p| p.pid == pid));
        let mut any = false;
        for p in running {
            any |= *self.may_serve_mps.entry((index, p.pid)).or_insert_with(|| {
                std::fs::read_to_string(procfs.join(p.pid.to_string()).join("comm"))
                    .map_or(true, |comm| comm.trim_end() == MPS_SERVER_COMM)
            });
        }
        any
    }
}

/// Receive and transmit bytes per second of one link.
type LinkRates = (Option<f64>, Option<f64>);

/// Remapped rows: correctable, uncorrectable, pending, failed. No wrapper
/// for this call exists, so it goes to the library directly.
///
/// Calls into the library take the function pointer that loading it found
/// (`None` from a driver older than the call) rather than the sys crate's
/// method of the same name, which panics when the symbol is missing: a
/// panic fails the whole tick of every GPU, every tick.
fn remapped_rows(nvml: &Nvml, d: &Device<'_>) -> Option<(u64, u64, bool, bool)> {
    let get = *nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok()?;
    let (mut correctable, mut uncorrectable, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the handle is live while `d` is, and the four out-pointers are
    // valid u32s that the call fills.
    let status = unsafe {
        get(
            d.handle(),
            &mut correctable,
            &mut uncorrectable,
            &mut pending,
            &mut failed,
        )
    };
    (status == 0).then_some((
        u64::from(correctable),
        u64::from(uncorrectable),
        pending != 0,
        failed != 0,
    ))
}

/// The profile in the name NVML gives a MIG device: the product's name,
/// then "MIG" and the profile ("NVIDIA H100 80GB HBM3 MIG 1g.10gb"); a
/// name without it is kept whole.
fn mig_profile(name: &str) -> &str {
    name.rsplit_once(" MIG ").map_or(name, |(_, profile)| profile.trim())
}

/// The MIG devices of a GPU with MIG on.
fn mig_instances(nvml: &Nvml, d: &Device<'_>) -> Vec<MigSample> {
    let count = d.mig_device_count().unwrap_or(0);
    let mut instances = Vec::new();
    for i in 0..count {
        let Ok(m) = d.mig_device_by_index(i) else {
            continue;
        };
        let mut instance = 0u32;
        // As in `remapped_rows`: the pointer, not the method that panics.
        let read = nvml
            .lib()
            .nvmlDeviceGetGpuInstanceId
            .as_ref()
            .ok()
            // SAFETY: a live MIG handle and a valid out-pointer.
            .is_some_and(|get| unsafe { get(m.handle(), &mut instance) } == 0);
        let memory = nvml_fallback::memory(nvml, &m).ok();
        instances.push(MigSample {
            // The handle's index is no instance id: a process's
            // `gpu_instance` would match the wrong instance.
            gpu_instance: read.then_some(instance),
            uuid: m.uuid().unwrap_or_default(),
            profile: mig_profile(&m.name().unwrap_or_default()).to_string(),
            memory_used_bytes: memory.map(|m| m.used_bytes),
            memory_total_bytes: memory.map(|m| m.total_bytes),
            sm_active_ratio: None,
        });
    }
    instances
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        self.xid_stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.xid_thread.take() {
            // A wedged driver can hold the wait for ever: the agent's stop
            // and a reload do not wait on it (NVML itself is never shut
            // down, so the thread left behind calls into a live library).
            if crate::ticks::join_within(thread, Duration::from_secs(3)).is_none() {
                tracing::error!("The NVML XID thread did not stop; left behind (a wedged driver?).");
            }
        }
    }
}

/// How long the XID thread waits before making its event set again: after a
/// wait failed, and, while some GPU refused to register (lost at start, say),
/// to try that GPU again.
const XID_SET_RETRY: Duration = Duration::from_secs(10);

/// The XID thread: waits on an event set of every GPU that registers and
/// queues what arrives. A failed wait, or a GPU that would not register,
/// makes the set again after [`XID_SET_RETRY`] rather than stopping: XID
/// counting that stopped for good would read as a node with no errors.
fn xid_loop(nvml: &'static Nvml, count: u32, xids: &Mutex<Vec<XidEvent>>, stop: &AtomicBool) {
    let mut refused: HashSet<u32> = HashSet::new();
    // Whether counting is interrupted: warned of once, and said when it
    // counts again.
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        let set = match xid_event_set(nvml, count, &mut refused) {
            Ok(set) => set,
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(
                        error = %e,
                        retry_secs = XID_SET_RETRY.as_secs(),
                        "No NVML event set: XID errors are not counted until one can be made."
                    );
                }
                pause(stop, XID_SET_RETRY);
                continue;
            }
        };
        let remake_at = (!refused.is_empty()).then(|| Instant::now() + XID_SET_RETRY);
        while !stop.load(Ordering::Relaxed) && remake_at.is_none_or(|at| Instant::now() < at) {
            let waited = set.wait(500);
            if matches!(waited, Ok(_) | Err(NvmlError::Timeout))
                && std::mem::replace(&mut failing, false)
            {
                tracing::info!("XID errors are counted again.");
            }
            match waited {
                Ok(event) => queue_xid(event, xids),
                Err(NvmlError::Timeout) => {}
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(
                            error = %e,
                            retry_secs = XID_SET_RETRY.as_secs(),
                            "NVML event wait failed: XID errors are not counted until a new event set waits."
                        );
                    }
                    pause(stop, XID_SET_RETRY);
                    break;
                }
            }
        }
        // What arrived since the last wait, before the set goes.
        while let Ok(event) = set.wait(0) {
            queue_xid(event, xids);
        }
    }
}

fn queue_xid(event: EventData<'_>, xids: &Mutex<Vec<XidEvent>>) {
    let Some(XidError::Value(xid)) = event.event_data else {
        return;
    };
    let uuid = event.device.uuid().unwrap_or_default();
    xids.lock().expect("not poisoned").push(XidEvent {
        uuid,
        xid,
        time_us: now_us(),
    });
}

/// An event set with every GPU that registers for XID errors; `refused`
/// keeps those that did not, each logged at its first refusal.
/// A refused registration releases the set (nvml-wrapper frees it), so the
/// set is made again with the GPUs registered before.
fn xid_event_set(
    nvml: &'static Nvml,
    count: u32,
    refused: &mut HashSet<u32>,
) -> Result<EventSet<'static>, NvmlError> {
    let register = |index: u32, set: EventSet<'static>| {
        let device = nvml.device_by_index(index)?;
        device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| e.error)
    };
    let mut set = nvml.create_event_set()?;
    let mut registered: Vec<u32> = Vec::new();
    for index in 0..count {
        match register(index, set) {
            Ok(with) => {
                set = with;
                registered.push(index);
                if refused.remove(&index) {
                    tracing::info!(gpu = index, "XID events of this GPU are counted again.");
                }
            }
            Err(e) => {
                if refused.insert(index) {
                    tracing::warn!(
                        gpu = index,
                        error = %e,
                        retry_secs = XID_SET_RETRY.as_secs(),
                        "This GPU did not register for XID events: its XID errors are not counted until it does."
                    );
                }
                set = nvml.create_event_set()?;
                for &again in &registered {
                    set = register(again, set)?;
                }
            }
        }
    }
    Ok(set)
}

/// Sleeps for `duration`, or until `stop`.
fn pause(stop: &AtomicBool, duration: Duration) {
    let until = Instant::now() + duration;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether MIG is on, from the mode read; `None` when the read failed. A
/// product without MIG (NOT_SUPPORTED: an L40S, a V100) and a driver from
/// before MIG (no such call) have it off: taken as unknown, that GPU would
/// never count as quiet, and a single process's shares, which its GPU's
/// utilisation gives, would cost a driver call.
fn mig_on(read: Result<MigMode, NvmlError>) -> Option<bool> {
    match read {
        Ok(mode) => Some(mode.current == 1),
        Err(
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound,
        ) => Some(false),
        Err(_) => None,
    }
}

/// What NVML says of the GPU at `index`. A GPU that cannot even be opened
/// still gets one, with [`unread_uuid`]: its samples fail and say why.
fn identity_of(nvml: &Nvml, index: u32) -> GpuIdentity {
    match nvml.device_by_index(index) {
        Ok(d) => {
            let name = d.name().unwrap_or_else(|_| "unknown".into());
            GpuIdentity {
                index,
                uuid: d.uuid().unwrap_or_else(|_| unread_uuid(index)),
                nvlink_links_product: nvlink_links_of_product(&name),
                name,
                pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                architecture: d
                    .architecture()
                    .map(|a| a.to_string().to_ascii_lowercase())
                    .unwrap_or_else(|_| "unknown".into()),
                memory_bus_width_bits: d.memory_bus_width().ok(),
                memory_clock_max_hz: hz(d.max_clock_info(Clock::Memory)),
                sm_clock_max_hz: hz(d.max_clock_info(Clock::SM)),
                pcie_link_gen_max: d.max_pcie_link_gen().ok(),
                pcie_link_width_max: d.max_pcie_link_width().ok(),
                gpm_supported: d.gpm_support().unwrap_or(false),
            }
        }
        Err(e) => GpuIdentity {
            index,
            uuid: unread_uuid(index),
            name: format!("unavailable: {e}"),
            pci_bus_id: String::new(),
            architecture: "unknown".into(),
            memory_bus_width_bits: None,
            memory_clock_max_hz: None,
            sm_clock_max_hz: None,
            pcie_link_gen_max: None,
            pcie_link_width_max: None,
            nvlink_links_product: None,
            gpm_supported: false,
        },
    }
}

fn lost_or_failed(e: NvmlError) -> SampleError {
    match e {
        NvmlError::GpuLost => {
            SampleError::Lost("NVML says the GPU is lost (fell off the bus)".into())
        }
        other => SampleError::Failed(other.to_string()),
    }
}

fn hz(mhz: Result<u32, NvmlError>) -> Option<f64> {
    mhz.ok().map(|m| f64::from(m) * 1e6)
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn driver_version(&self) -> String {
        self.nvml
            .sys_driver_version()
            .unwrap_or_else(|_| "unknown".into())
    }

    fn older_driver_calls(&self) -> Vec<String> {
        nvml_fallback::older_calls(self.nvml)
    }

    fn identities(&mut self) -> Result<Vec<GpuIdentity>, String> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| format!("NVML could not count the GPUs: {e}"))?;
        let gpus: Vec<GpuIdentity> = (0..count).map(|index| identity_of(self.nvml, index)).collect();
        self.start_xid_thread(count);
        Ok(gpus)
    }

    fn identity(&mut self, index: u32) -> Option<GpuIdentity> {
        Some(identity_of(self.nvml, index))
    }

    fn sample(
        &mut self,
        gpu: &GpuIdentity,
        _time_us: i64,
        plan: ReadPlan,
    ) -> Result<GpuSample, SampleError> {
        let mut reads = Reads(self.read_times.is_some().then(Vec::new));
        let d = reads
            .time("device_by_index", || self.nvml.device_by_index(gpu.index))
            .map_err(lost_or_failed)?;
        // The cheapest call that fails on a lost GPU goes first, so a lost GPU
        // costs one call a tick.
        let memory = reads
            .time("memory_info", || nvml_fallback::memory(self.nvml, &d))
            .map_err(lost_or_failed)?;
        let utilization = reads
            .time("utilization_rates", || d.utilization_rates())
            .ok();
        let utilization_gpu_ratio = utilization.as_ref().map(|u| f64::from(u.gpu) / 100.0);
        // The values that change rarely, and counters read for their
        // increase, only when the plan says (every slow_reads_interval_secs):
        // mig_mode and the replay counter cost the driver 0.4-0.5 ms of CPU
        // each (docs/gpus.md); the collector carries them in between.
        let slow = plan.slow;
        let mig_read = slow
            .then(|| reads.time("mig_mode", || mig_on(d.mig_mode())))
            .flatten();
        let mig_enabled = plan.mig_mode(mig_read);
        // The processes before GPM: whether anything runs decides whether
        // GPM and the PCIe link are read.
        let (processes, processes_unlisted, process_shares_read) =
            self.processes(gpu.index, &d, &mut reads, plan, mig_enabled);
        let quiet = is_quiet(
            utilization_gpu_ratio,
            processes_unlisted.is_none().then_some(processes.len()),
            mig_enabled,
        );
        let skip_quiet_reads = plan.skip_quiet_reads && quiet;
        let skip_link = skip_quiet_reads || plan.holds_loaded_link(utilization_gpu_ratio);
        // Link state before GPM, which asks for the rates of the links up.
        let links = if slow {
            reads.time("nvlink is_active, error_counter", || {
                self.links(gpu.index, &d)
            })
        } else {
            Vec::new()
        };
        let (gpm, link_rates) = match (self.use_gpm && gpu.gpm_supported && !skip_quiet_reads)
            .then(|| reads.time("gpm_sample, gpm_metrics_get", || self.gpm(gpu.index, &d)))
            .flatten()
        {
            Some((metrics, rates)) => (Some(metrics), rates),
            None => (None, Vec::new()),
        };
        // NVML's own PCIe throughput holds the calling thread for its 20 ms
        // sampling window, each direction (21 ms wall, 1 ms CPU on an H100);
        // where GPM measured the whole interval, that read would be thrown away.
        let gpm_has_pcie = gpm.as_ref().is_some_and(|g| {
            g.pcie_rx_bytes_per_second.is_some() && g.pcie_tx_bytes_per_second.is_some()
        });
        let (pcie_rx, pcie_tx) = if gpm_has_pcie || skip_quiet_reads {
            (None, None)
        } else {
            let kib = |r: Result<u32, NvmlError>| r.ok().map(|kib| f64::from(kib) * 1024.0);
            (
                kib(reads.time("pcie_throughput(rx)", || {
                    d.pcie_throughput(PcieUtilCounter::Receive)
                })),
                kib(reads.time("pcie_throughput(tx)", || {
                    d.pcie_throughput(PcieUtilCounter::Send)
                })),
            )
        };
        let remapped = slow
            .then(|| reads.time("remapped_rows", || remapped_rows(self.nvml, &d)))
            .flatten();
        let memory_temperature = reads
            .time("field_values(memory temperature)", || {
                d.field_values_for(&[FieldId(FIELD_MEMORY_TEMPERATURE)])
            })
            .ok()
            .and_then(|v| v.into_iter().next())
            .and_then(|s: Result<FieldValueSample, NvmlError>| s.ok())
            .and_then(|s| s.value.ok())
            .map(|v| match v {
                SampleValue::F64(x) => x,
                SampleValue::U32(x) => f64::from(x),
                SampleValue::U64(x) => x as f64,
                SampleValue::I64(x) => x as f64,
            });
        let mig = if mig_enabled == Some(true) {
            reads.time("mig instances", || mig_instances(self.nvml, &d))
        } else {
            Vec::new()
        };
        let sample = GpuSample {
            utilization_gpu_ratio,
            utilization_memory_ratio: utilization.as_ref().map(|u| f64::from(u.memory) / 100.0),
            gpm,
            sm_clock_hz: hz(reads.time("clock_info(sm)", || d.clock_info(Clock::SM))),
            memory_clock_hz: hz(reads.time("clock_info(memory)", || d.clock_info(Clock::Memory))),
            clock_event_reasons: reads
                .time("current_throttle_reasons", || d.current_throttle_reasons())
                .ok()
                .map(|r| r.bits()),
            power_watts: reads
                .time("power_usage", || d.power_usage())
                .ok()
                .map(|mw| f64::from(mw) / 1000.0),
            power_limit_watts: slow
                .then(|| {
                    reads
                        .time("enforced_power_limit", || d.enforced_power_limit())
                        .ok()
                })
                .flatten()
                .map(|mw| f64::from(mw) / 1000.0),
            // The driver's dearest read of an idle tick (docs/gpus.md): the
            // collector asks for it every energy_interval_secs (a quiet GPU
            // every quiet_energy_interval_secs) and integrates power_usage in
            // between.
            energy_joules: plan
                .reads_energy(quiet)
                .then(|| reads.time("total_energy_consumption", || d.total_energy_consumption()))
                .and_then(Result::ok)
                .map(|mj| mj as f64 / 1000.0),
            temperature_celsius: reads
                .time("temperature", || d.temperature(TemperatureSensor::Gpu))
                .ok()
                .map(f64::from),
            memory_temperature_celsius: memory_temperature,
            memory_used_bytes: Some(memory.used_bytes),
            memory_total_bytes: Some(memory.total_bytes),
            ecc_corrected_errors: slow
                .then(|| {
                    reads
                        .time("total_ecc_errors(corrected)", || {
                            d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                        })
                        .ok()
                })
                .flatten(),
            ecc_uncorrected_errors: slow
                .then(|| {
                    reads
                        .time("total_ecc_errors(uncorrected)", || {
                            d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                        })
                        .ok()
                })
                .flatten(),
            remapped_rows_correctable: remapped.map(|r| r.0),
            remapped_rows_uncorrectable: remapped.map(|r| r.1),
            remapping_pending: remapped.map(|r| r.2),
            remapping_failed: remapped.map(|r| r.3),
            pcie_rx_bytes_per_second: pcie_rx,
            pcie_tx_bytes_per_second: pcie_tx,
            // Second only to GPM among an H200's per-tick reads
            // (docs/gpus.md); an idle link trains down by design, and the
            // first tick a GPU is not quiet reads it again. Under load a
            // link read at its maximum is held (`ReadPlan::hold_loaded_link`).
            pcie_link_gen: (!skip_link)
                .then(|| {
                    reads
                        .time("current_pcie_link_gen", || d.current_pcie_link_gen())
                        .ok()
                })
                .flatten(),
            pcie_link_width: (!skip_link)
                .then(|| {
                    reads
                        .time("current_pcie_link_width", || d.current_pcie_link_width())
                        .ok()
                })
                .flatten(),
            pcie_replays: slow
                .then(|| {
                    reads
                        .time("pcie_replay_counter", || d.pcie_replay_counter())
                        .ok()
                })
                .flatten()
                .map(u64::from),
            virtualization_mode: slow
                .then(|| {
                    reads
                        .time("virtualization_mode", || d.virtualization_mode())
                        .ok()
                })
                .flatten()
                .and_then(|m| match m {
                    GpuVirtualizationMode::Bare => Some(VirtualizationMode::Bare),
                    GpuVirtualizationMode::PassThrough => Some(VirtualizationMode::Passthrough),
                    GpuVirtualizationMode::Vgpu => Some(VirtualizationMode::Vgpu),
                    GpuVirtualizationMode::HostVgpu => Some(VirtualizationMode::HostVgpu),
                    GpuVirtualizationMode::HostVsga => Some(VirtualizationMode::HostVsga),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }),
            mig_enabled: mig_read,
            links,
            link_rates,
            mig,
            processes,
            processes_unlisted,
            process_shares_read,
            quiet,
        };
        if let (Some(all), Some(times)) = (self.read_times.as_mut(), reads.0) {
            all.insert(gpu.index, times);
        }
        Ok(sample)
    }

    fn take_xids(&mut self) -> Vec<XidEvent> {
        std::mem::take(&mut *self.xids.lock().expect("not poisoned"))
    }

    fn time_reads(&mut self) {
        self.read_times.get_or_insert_with(HashMap::new);
    }

    fn read_times(&self, gpu: u32) -> Vec<ReadTime> {
        self.read_times
            .as_ref()
            .and_then(|all| all.get(&gpu))
            .cloned()
            .unwrap_or_default()
    }
}

/// Times each driver read when the doctor asks for it (Some); a plain call
/// otherwise.
struct Reads(Option<Vec<ReadTime>>);

impl Reads {
    fn time<T>(&mut self, read: &'static str, call: impl FnOnce() -> T) -> T {
        let Some(times) = self.0.as_mut() else {
            return call();
        };
        let (wall, cpu_ns) = (Instant::now(), thread_cpu_ns());
        let value = call();
        times.push(ReadTime {
            read,
            wall_seconds: wall.elapsed().as_secs_f64(),
            cpu_seconds: thread_cpu_ns().saturating_sub(cpu_ns) as f64 * 1e-9,
        });
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVML names a MIG device after its product; the profile is the part
    /// after "MIG" (the table's tag had held the whole name).
    #[test]
    fn a_mig_devices_profile_is_read_from_its_name() {
        assert_eq!(mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb"), "1g.10gb");
        assert_eq!(mig_profile("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb"), "1c.3g.20gb");
        assert_eq!(mig_profile("3g.40gb"), "3g.40gb");
    }

    #[test]
    fn gpm_asks_for_the_rates_of_the_links_up_only() {
        assert_eq!(GpmAsk::new(&[]).ids, GPM_GPU_WIDE.to_vec());
        let two = GpmAsk::new(&[3, 17]).ids;
        assert_eq!(two.len(), GPM_GPU_WIDE.len() + 4);
        assert_eq!(
            two[GPM_GPU_WIDE.len()..],
            [
                GpmMetricId::NvlinkL3RxPerSec,
                GpmMetricId::NvlinkL3TxPerSec,
                GpmMetricId::NvlinkL17RxPerSec,
                GpmMetricId::NvlinkL17TxPerSec,
            ]
        );
        // Before the first link read: every link.
        let all = GpmAsk::new(&ALL_LINKS).ids;
        assert_eq!(all.len(), GPM_GPU_WIDE.len() + 2 * NVLINK_MAX_LINKS as usize);
        assert_eq!(all.last(), Some(&GpmMetricId::NvlinkL17TxPerSec));
        // A link number past the last one asks for nothing more.
        assert_eq!(GpmAsk::new(&[18]).ids, GPM_GPU_WIDE.to_vec());
    }

    /// The calls made at `.lib()` of each file that holds an `Nvml`: the
    /// name after it, and whether it is called straight away (`(`) rather
    /// than taken as the loaded function pointer (`.as_ref()`).
    fn sys_calls(source: &str) -> Vec<(String, bool)> {
        source
            .split(".lib()")
            .skip(1)
            .map(|after| {
                let after = after.trim_start().trim_start_matches('.').trim_start();
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let called = after[name.len()..].trim_start().starts_with('(');
                (name, called)
            })
            .collect()
    }

    #[test]
    fn library_calls_never_take_the_method_that_panics_on_an_old_driver() {
        let sources = [
            ("nvml.rs", include_str!("nvml.rs")),
            ("gpu_probe/engine/facts.rs", include_str!("../gpu_probe/engine/facts.rs")),
        ];
        let mut seen = 0;
        for (file, source) in sources {
            // The code, not this test's own examples below.
            let code = source.split("#[cfg(test)]").next().unwrap_or(source);
            for (name, called) in sys_calls(code) {
                if name.starts_with("nvml") {
                    seen += 1;
                    assert!(!called, "{file}: lib().{name}(...) panics where the driver lacks it");
                }
            }
        }
        assert!(seen >= 2, "remapped rows and the MIG instance id go to the library");
        // The check itself tells the two forms apart.
        let method = "nvml.lib()\n    .nvmlDeviceGetX(h)";
        let pointer = "nvml.lib().nvmlDeviceGetX.as_ref()";
        assert_eq!(sys_calls(method), [("nvmlDeviceGetX".to_string(), true)]);
        assert_eq!(sys_calls(pointer), [("nvmlDeviceGetX".to_string(), false)]);
    }

    #[test]
    fn each_links_rates_land_on_its_own_number() {
        let ask = GpmAsk::new(&[3, 17]);
        // The metric at position i reads i.
        let rates = per_link_rates(&ask.links, |i| Some(i as f64));
        assert_eq!(rates.len(), NVLINK_MAX_LINKS as usize);
        assert_eq!(rates[3], (Some(8.0), Some(9.0)));
        assert_eq!(rates[17], (Some(10.0), Some(11.0)));
        let others = rates.iter().enumerate().filter(|(l, _)| ![3, 17].contains(l));
        assert!(others.into_iter().all(|(_, r)| *r == (None, None)));
        // Every link asked, in order: link l at 8 + 2l.
        let all = per_link_rates(&GpmAsk::new(&ALL_LINKS).links, |i| Some(i as f64));
        assert_eq!(all[0], (Some(8.0), Some(9.0)));
        assert_eq!(all[17], (Some(42.0), Some(43.0)));
        // Only the GPU-wide metrics: no link has rates.
        let none = per_link_rates(&GpmAsk::new(&[]).links, |i| Some(i as f64));
        assert!(none.iter().all(|r| *r == (None, None)));
    }

    #[test]
    fn a_version_mismatch_names_both_versions() {
        let dir = tempfile::tempdir().unwrap();
        let nvidia = dir.path().join("driver/nvidia");
        std::fs::create_dir_all(&nvidia).unwrap();
        for (line, version) in [
            (
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023",
                "535.104.05",
            ),
            (
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 09:23:31 UTC 2025",
                "580.95.05",
            ),
        ] {
            std::fs::write(nvidia.join("version"), format!("{line}\nGCC version:  gcc 12.2.0\n"))
                .unwrap();
            assert_eq!(kernel_module_version(dir.path()).as_deref(), Some(version));
        }
        std::fs::write(nvidia.join("version"), "NVRM version: garbled\n").unwrap();
        assert_eq!(kernel_module_version(dir.path()), None);
        assert_eq!(kernel_module_version(&dir.path().join("none")), None);

        assert!(is_driver_version("470.256") && is_driver_version("580.159.04"));
        for not in ["1", "x86_64", "580..04", "580.95.05a", ".5", ""] {
            assert!(!is_driver_version(not), "{not}");
        }
        let both = versions_apart(Some("580.95.05".into()), Some("580.159.04".into()));
        assert_eq!(both, " (kernel module 580.95.05, library 580.159.04)");
        assert_eq!(versions_apart(None, Some("580.159.04".into())), " (library 580.159.04)");
        assert_eq!(versions_apart(None, None), "");
    }
}
