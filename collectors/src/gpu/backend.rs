//! What a GPU backend tells the collector: the facts of each GPU, read once,
//! and a sample per tick. NVML and the simulated backend both speak it, so the
//! collector, the tables and the tests do not know which one runs.

/// Facts about one GPU that do not change while the driver is loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuIdentity {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// PCI bus id, e.g. `00000000:18:00.0`.
    pub pci_bus_id: String,
    /// `hopper`, `ampere`, …; `unknown` when the driver does not say.
    pub architecture: String,
    /// Width of the memory bus.
    pub memory_bus_width_bits: Option<u32>,
    /// Highest memory clock.
    pub memory_clock_max_hz: Option<f64>,
    /// Highest SM clock.
    pub sm_clock_max_hz: Option<f64>,
    /// Highest PCIe generation of the GPU and the slot together.
    pub pcie_link_gen_max: Option<u32>,
    /// Widest PCIe link of the GPU and the slot together.
    pub pcie_link_width_max: Option<u32>,
    /// NVLink links this product has (from the product name); `None` when unknown.
    pub nvlink_links_product: Option<u32>,
    /// Whether the GPU has GPM (Hopper and newer).
    pub gpm_supported: bool,
}

/// What stands for the UUID of a GPU whose UUID could not be read when it
/// was found (lost then): its other facts are placeholders too, until the
/// collector reads them again once it answers.
pub fn unread_uuid(index: u32) -> String {
    format!("unknown-{index}")
}

impl GpuIdentity {
    /// Whether this GPU's UUID, and with it its facts, could not be read
    /// when it was found ([`unread_uuid`]).
    pub fn uuid_unread(&self) -> bool {
        self.uuid == unread_uuid(self.index)
    }

    /// Peak HBM bandwidth: bus width times the maximum memory clock, two
    /// transfers a clock (HBM is double data rate). 5120 bits at 2619 MHz is an
    /// H100 SXM's 3.35 TB/s.
    pub fn hbm_peak_bytes_per_second(&self) -> Option<f64> {
        let width = self.memory_bus_width_bits?;
        let clock = self.memory_clock_max_hz?;
        Some(f64::from(width) / 8.0 * clock * 2.0)
    }

    /// Peak NVLink throughput, receive plus transmit, over the links the
    /// product has: 18 links × 25 GB/s each way is an H100 SXM's 900 GB/s.
    /// Against the product's links, not those up, so hidden links show as
    /// throughput the node cannot reach. NVML gives no NVLink peak.
    pub fn nvlink_peak_bytes_per_second(&self) -> Option<f64> {
        self.nvlink_peak_bytes_per_second_over(self.nvlink_links_product?)
    }

    /// Peak NVLink throughput over `links` of this GPU's generation.
    pub fn nvlink_peak_bytes_per_second_over(&self, links: u32) -> Option<f64> {
        let each_way = nvlink_link_bytes_per_second_each_way(&self.architecture)?;
        Some(f64::from(links) * each_way * 2.0)
    }
}

/// What a PCIe lane carries each way, after line coding, in bytes/s:
/// 8b/10b for Gen1 and Gen2 (2.5 and 5 GT/s), 128b/130b for Gen3 to Gen5
/// (8, 16 and 32 GT/s), and FLIT mode's 242/256 of 8 and 16 GB/s for Gen6
/// and Gen7 (64 and 128 GT/s, PAM4); `None` for a generation we do not know.
/// The tax's PCIe loss and the transfer probe's peaks both use it.
pub fn pcie_lane_bytes_per_second(gen: u32) -> Option<f64> {
    match gen {
        1 => Some(0.25e9),
        2 => Some(0.5e9),
        3 => Some(0.985e9),
        4 => Some(1.969e9),
        5 => Some(3.938e9),
        6 => Some(7.5625e9),
        7 => Some(15.125e9),
        _ => None,
    }
}

/// What one NVLink link carries each way, by the GPU architecture's NVLink
/// generation: 20 GB/s (NVLink 1, Pascal), 25 GB/s (NVLink 2 to 4, Volta to
/// Hopper), 50 GB/s (NVLink 5, Blackwell); `None` for one we do not know.
pub fn nvlink_link_bytes_per_second_each_way(architecture: &str) -> Option<f64> {
    match architecture {
        "pascal" => Some(20e9),
        "volta" | "turing" | "ampere" | "ada" | "hopper" => Some(25e9),
        "blackwell" => Some(50e9),
        _ => None,
    }
}

/// GPU Performance Monitoring metrics (Hopper and newer), over the last interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpmMetrics {
    /// Fraction of SMs with at least one warp resident, averaged over time.
    pub sm_active_ratio: Option<f64>,
    /// Resident warps against the SMs' maximum.
    pub sm_occupancy_ratio: Option<f64>,
    /// Fraction of time any tensor pipe was busy.
    pub tensor_active_ratio: Option<f64>,
    /// DRAM bandwidth used against the peak.
    pub dram_bandwidth_ratio: Option<f64>,
    /// PCIe receive throughput (NVML reports MiB/s; converted).
    pub pcie_rx_bytes_per_second: Option<f64>,
    /// PCIe transmit throughput.
    pub pcie_tx_bytes_per_second: Option<f64>,
    /// NVLink receive throughput over all links.
    pub nvlink_rx_bytes_per_second: Option<f64>,
    /// NVLink transmit throughput over all links.
    pub nvlink_tx_bytes_per_second: Option<f64>,
}

/// One NVLink link of a GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkSample {
    /// Link number, from 0.
    pub link: u32,
    /// Whether the link is up.
    pub active: bool,
    /// Receive throughput (GPM).
    pub rx_bytes_per_second: Option<f64>,
    /// Transmit throughput (GPM).
    pub tx_bytes_per_second: Option<f64>,
    /// CRC errors on data flits.
    pub crc_errors: Option<u64>,
    /// Replays.
    pub replay_errors: Option<u64>,
    /// Link recoveries.
    pub recovery_errors: Option<u64>,
}

/// One MIG GPU instance.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MigSample {
    /// GPU instance id; `None` where the driver did not give it.
    pub gpu_instance: Option<u32>,
    /// `MIG-…` UUID.
    pub uuid: String,
    /// Profile, e.g. `1g.10gb`; the product name NVML gives the instance otherwise.
    pub profile: String,
    /// Memory used in the instance.
    pub memory_used_bytes: Option<u64>,
    /// Memory of the instance.
    pub memory_total_bytes: Option<u64>,
    /// GPM SM activity of the instance.
    pub sm_active_ratio: Option<f64>,
}

/// One process using a GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessSample {
    /// Process id in the agent's PID namespace.
    pub pid: u32,
    /// GPU memory the process holds.
    pub used_memory_bytes: Option<u64>,
    /// Its share of SM time over the last interval.
    pub sm_utilization_ratio: Option<f64>,
    /// Its share of memory-controller time over the last interval.
    pub memory_utilization_ratio: Option<f64>,
    /// MIG GPU instance it runs in.
    pub gpu_instance: Option<u32>,
}

/// Virtualisation mode NVML reports for a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VirtualizationMode {
    /// No hypervisor between the driver and the GPU.
    Bare,
    /// Whole GPU passed through to a VM.
    Passthrough,
    /// A vGPU inside a VM.
    Vgpu,
    /// The hypervisor's side of vGPU.
    HostVgpu,
    /// The hypervisor's side of vSGA.
    HostVsga,
}

impl VirtualizationMode {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            VirtualizationMode::Bare => "bare",
            VirtualizationMode::Passthrough => "passthrough",
            VirtualizationMode::Vgpu => "vgpu",
            VirtualizationMode::HostVgpu => "host_vgpu",
            VirtualizationMode::HostVsga => "host_vsga",
        }
    }
}

/// Everything read from one GPU at one tick. `None` is "not supported here"
/// (or not readable this tick), never zero.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// Fraction of time a kernel was running.
    pub utilization_gpu_ratio: Option<f64>,
    /// Fraction of time device memory was being read or written.
    pub utilization_memory_ratio: Option<f64>,
    /// GPM metrics; `None` before Hopper, on the first tick, or when turned off.
    pub gpm: Option<GpmMetrics>,
    /// SM clock now.
    pub sm_clock_hz: Option<f64>,
    /// Memory clock now.
    pub memory_clock_hz: Option<f64>,
    /// NVML's clock event (throttle) reasons bitmask.
    pub clock_event_reasons: Option<u64>,
    /// Power draw.
    pub power_watts: Option<f64>,
    /// Power limit enforced now (a slow read).
    pub power_limit_watts: Option<f64>,
    /// Energy since the driver loaded: the driver's exact counter, read only
    /// when the tick's [`ReadPlan`] asks for it (`None` otherwise, or on a
    /// board without the counter).
    pub energy_joules: Option<f64>,
    /// GPU die temperature.
    pub temperature_celsius: Option<f64>,
    /// HBM temperature.
    pub memory_temperature_celsius: Option<f64>,
    /// Device memory in use.
    pub memory_used_bytes: Option<u64>,
    /// Device memory.
    pub memory_total_bytes: Option<u64>,
    /// Corrected ECC errors since the driver loaded (a slow read).
    pub ecc_corrected_errors: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded (a slow read).
    pub ecc_uncorrected_errors: Option<u64>,
    /// Rows remapped for correctable errors (a slow read, as are the
    /// other three remapping values).
    pub remapped_rows_correctable: Option<u64>,
    /// Rows remapped for uncorrectable errors.
    pub remapped_rows_uncorrectable: Option<u64>,
    /// A remapping waits for a GPU reset.
    pub remapping_pending: Option<bool>,
    /// A remapping failed.
    pub remapping_failed: Option<bool>,
    /// PCIe receive throughput (NVML's 20 ms sample); not read where GPM
    /// gives it, since that read holds the sampling thread for the 20 ms.
    pub pcie_rx_bytes_per_second: Option<f64>,
    /// PCIe transmit throughput.
    pub pcie_tx_bytes_per_second: Option<f64>,
    /// PCIe generation the link trained to; `None` on a tick that skipped
    /// the link (a quiet tick, or one under load with the plan's
    /// `hold_loaded_link`), and the collector puts the held read on it.
    pub pcie_link_gen: Option<u32>,
    /// PCIe lanes the link trained to.
    pub pcie_link_width: Option<u32>,
    /// PCIe replays since the driver loaded (a slow read).
    pub pcie_replays: Option<u64>,
    /// Virtualisation mode (a slow read).
    pub virtualization_mode: Option<VirtualizationMode>,
    /// Whether MIG is on (a slow read).
    pub mig_enabled: Option<bool>,
    /// NVLink links the GPU exposes, with their state and error counters
    /// (a slow read: empty on a tick without it) and their GPM rates.
    pub links: Vec<LinkSample>,
    /// GPM's receive and transmit bytes/s of each link by link number,
    /// every tick GPM ran: the collector puts them on the links it carries
    /// between slow reads.
    pub link_rates: Vec<(Option<f64>, Option<f64>)>,
    /// MIG instances.
    pub mig: Vec<MigSample>,
    /// Processes using the GPU.
    pub processes: Vec<ProcessSample>,
    /// Why the driver did not list the processes this tick (no permission,
    /// say); `None` when it did. An empty list is then not "no process".
    pub processes_unlisted: Option<String>,
    /// Whether the driver was asked for the processes' shares this tick: when
    /// not, their shares are `None` and the collector fills them.
    pub process_shares_read: bool,
    /// Whether the GPU was quiet this tick ([`is_quiet`]). With the plan's
    /// `skip_quiet_reads`, GPM, the PCIe throughput and the PCIe link were
    /// then not read: they are `None`, and the collector puts the last quiet
    /// tick's on the sample.
    pub quiet: bool,
}

/// Whether a GPU is quiet: the driver lists no compute process on it, no
/// kernel ran in the driver's last utilisation period, and MIG is off (with
/// MIG on, the GPU-wide utilisation does not speak for the instances).
/// Nothing can run on a GPU without a context, so from one quiet tick to
/// the next its GPM figures and PCIe link have nothing new to say.
/// `processes` is `None` when the list could not be read.
pub fn is_quiet(
    utilization_gpu_ratio: Option<f64>,
    processes: Option<usize>,
    mig_enabled: Option<bool>,
) -> bool {
    utilization_gpu_ratio == Some(0.0) && processes == Some(0) && mig_enabled == Some(false)
}

/// Utilisation from which a GPU is under load: where its PCIe link should
/// run at the generation and width it can do (an idle link trains down by
/// design). `vtax doctor`'s problems and the fleet's `pcie_link_ratio`
/// compare the link with its maxima only there.
pub const UNDER_LOAD_UTILIZATION_RATIO: f64 = 0.5;

/// Whether a GPU at `utilization_gpu_ratio` is under load (`None`: not
/// known, as with MIG on, is not).
pub fn under_load(utilization_gpu_ratio: Option<f64>) -> bool {
    utilization_gpu_ratio.is_some_and(|u| u >= UNDER_LOAD_UTILIZATION_RATIO)
}

/// The reads of one tick that the collector spaces out: on an H100 the
/// energy counter costs the driver 3.1-4.9 ms of CPU a read and the
/// per-process shares 2.5-5.8 ms; `mig_mode` and the PCIe replay counter
/// 0.4-0.5 ms each and the NVLink state 0.1 ms, on an H200 as on an H100,
/// for values that change rarely or are counters read for their increase
/// (docs/gpus.md, "What each read costs").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPlan {
    /// Read the exact energy counter.
    pub energy: bool,
    /// When to ask the driver for the per-process shares.
    pub process_shares: SharesRead,
    /// Read the values that change rarely (see [`GpuSample`]: MIG mode,
    /// virtualisation mode, the enforced power limit, NVLink link state and
    /// error counters, the PCIe replay counter, ECC counters, remapped
    /// rows). When false they are `None` in the sample and the collector
    /// carries their last values.
    pub slow: bool,
    /// MIG mode as the last slow read found it, for a tick that does not
    /// read it: whether to list the MIG instances, and whether the
    /// processes' shares need the driver.
    pub mig_enabled: Option<bool>,
    /// The GPU was quiet at its last two ticks and its quiet reads are not
    /// due: if this tick finds it quiet still ([`is_quiet`]), skip GPM, the
    /// PCIe throughput and the PCIe link: on an idle H200, GPM and the
    /// link were most of what a GPU's second cost (docs/gpus.md, "the
    /// collector's cost read by read").
    pub skip_quiet_reads: bool,
    /// The GPU was quiet at every tick since its last exact energy read,
    /// and the quiet cadence (`quiet_energy_interval_secs`) has not come:
    /// if this tick finds it quiet still, skip the exact energy read that
    /// `energy` asks for. A quiet GPU's power hardly moves, so the
    /// integrated counter stays close to the exact one, and the exact read
    /// is the dearest part of an idle GPU's second (docs/gpus.md).
    pub skip_quiet_energy: bool,
    /// The PCIe link's last read was at a tick under load ([`under_load`]),
    /// as was every tick since, found the link at its maximum generation
    /// and width, and is younger than `loaded_link_interval_secs`: if this
    /// tick is under load too, skip the link's two reads, and the collector
    /// holds what that read found. A busy H200 spent 0.23 ms of the
    /// driver's CPU a tick on them, second only to GPM (docs/gpus.md).
    pub hold_loaded_link: bool,
    /// List the clients of an MPS server when the compute list may name
    /// one: only the process table wants them (`processes`).
    pub mps_clients: bool,
}

#[cfg(test)]
impl ReadPlan {
    /// Every read, as the collector made them before it spaced them out.
    pub const ALL: ReadPlan = ReadPlan {
        energy: true,
        process_shares: SharesRead::Always,
        slow: true,
        mig_enabled: None,
        skip_quiet_reads: false,
        skip_quiet_energy: false,
        hold_loaded_link: false,
        mps_clients: true,
    };
}

impl ReadPlan {
    /// Whether a tick that found the GPU `quiet` or not reads the exact
    /// energy counter.
    pub fn reads_energy(&self, quiet: bool) -> bool {
        self.energy && !(self.skip_quiet_energy && quiet)
    }

    /// Whether a tick that found the GPU at `utilization_gpu_ratio` skips
    /// the PCIe link reads and holds the last loaded read.
    pub fn holds_loaded_link(&self, utilization_gpu_ratio: Option<f64>) -> bool {
        self.hold_loaded_link && under_load(utilization_gpu_ratio)
    }

    /// MIG mode on a tick with the plan's slow reads: the one read then,
    /// else the one the plan carries.
    pub fn mig_mode(&self, read: Option<bool>) -> Option<bool> {
        if self.slow {
            read
        } else {
            self.mig_enabled
        }
    }
}

/// When the driver's per-process shares are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharesRead {
    /// Not this tick.
    Skip,
    /// Only where the GPU is shared (see [`shares_need_the_driver`]).
    IfShared,
    /// Whenever a compute process runs.
    Always,
}

impl SharesRead {
    /// Whether a GPU with `processes` compute processes and MIG in
    /// `mig_enabled` gets the driver's call.
    pub fn calls_the_driver(self, processes: usize, mig_enabled: Option<bool>) -> bool {
        match self {
            SharesRead::Skip => false,
            SharesRead::IfShared => shares_need_the_driver(processes, mig_enabled),
            SharesRead::Always => processes > 0,
        }
    }
}

/// Whether the processes' shares of a GPU need the driver's per-process
/// call. With MIG off and one compute process, that process had the GPU to
/// itself: its SM and memory shares are the GPU's utilisation, the same
/// sampled busy time the driver would split among processes. With MIG on the
/// GPU-wide utilisation is not the instance's, so the driver is asked.
pub fn shares_need_the_driver(processes: usize, mig_enabled: Option<bool>) -> bool {
    processes > 1 || (processes == 1 && mig_enabled != Some(false))
}

/// An XID error the driver reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidEvent {
    /// The GPU's UUID.
    pub uuid: String,
    /// The XID code.
    pub xid: u64,
    /// When the agent heard of it.
    pub time_us: i64,
}

/// Why a GPU gave no sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SampleError {
    /// The GPU is gone (fell off the bus, `GPU_IS_LOST`): skipped until the driver recovers it.
    Lost(String),
    /// This read failed; tried again next tick.
    Failed(String),
}

impl std::fmt::Display for SampleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SampleError::Lost(why) => write!(f, "GPU lost: {why}"),
            SampleError::Failed(why) => write!(f, "read failed: {why}"),
        }
    }
}

/// A source of GPU samples.
pub trait GpuBackend: Send {
    /// `nvml` or `simulated`.
    fn kind(&self) -> &'static str;
    /// Driver version, for the info row and the doctor.
    fn driver_version(&self) -> String;
    /// For the doctor: each read the driver serves through an older call
    /// than the backend's first choice, with what that changes.
    fn older_driver_calls(&self) -> Vec<String> {
        Vec::new()
    }
    /// The GPUs, read once per probe.
    fn identities(&mut self) -> Result<Vec<GpuIdentity>, String>;
    /// The GPU at `index` read again: for one whose facts could not be
    /// read when it was found.
    fn identity(&mut self, index: u32) -> Option<GpuIdentity> {
        self.identities()
            .ok()?
            .into_iter()
            .find(|g| g.index == index)
    }
    /// Reads one GPU, the dear reads as `plan` says.
    fn sample(
        &mut self,
        gpu: &GpuIdentity,
        time_us: i64,
        plan: ReadPlan,
    ) -> Result<GpuSample, SampleError>;
    /// XID errors since the last call.
    fn take_xids(&mut self) -> Vec<XidEvent>;
    /// Turns on timing each driver read, for `vtax doctor --gpu`.
    fn time_reads(&mut self) {}
    /// Each driver read of the GPU's last [`GpuBackend::sample`] and what it
    /// cost, when timing is on; backends that make no driver calls have none.
    fn read_times(&self, _gpu: u32) -> Vec<ReadTime> {
        Vec::new()
    }
}

/// What one driver read cost the sampling thread.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadTime {
    /// The read, named after the NVML call (or group of calls).
    pub read: &'static str,
    /// Wall-clock time the call took.
    pub wall_seconds: f64,
    /// CPU time the calling thread spent in it: below the wall time when the
    /// driver sleeps, equal to it when the library spins.
    pub cpu_seconds: f64,
}

/// NVLink links each product has, from its name; a VM that hides NVLink shows
/// fewer links up than this.
pub fn nvlink_links_of_product(name: &str) -> Option<u32> {
    let name = name.to_ascii_uppercase();
    let pcie = name.contains("PCIE");
    // The export versions (H800, A800) have NVLink cut to 400 GB/s both
    // ways: 8 links of 50 GB/s. Counted as their full siblings' 18 or 12,
    // a bare-metal H800 read as 10 links hidden by a hypervisor.
    if name.contains("H800") || name.contains("A800") {
        return Some(if pcie { 0 } else { 8 });
    }
    if name.contains("H100") || name.contains("H200") || name.contains("H20") {
        // SXM and the HBM3 boards have 18 fourth-generation links (900 GB/s
        // both ways). The NVL cards bridge over NVLink: the H100 NVL at
        // 600 GB/s (12 links), the H200 NVL at 900 GB/s (18). The H100 PCIe
        // has none without a bridge (the collector counts bridged links up
        // as the board's).
        return Some(if name.contains("NVL") && !name.contains("H200") {
            12
        } else if pcie {
            0
        } else {
            18
        });
    }
    if name.contains("GB200") || name.contains("B200") || name.contains("B100") {
        return Some(18);
    }
    if name.contains("A100") || name.contains("A800") {
        return Some(if pcie { 0 } else { 12 });
    }
    if name.contains("V100") {
        return Some(if pcie { 0 } else { 6 });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100 SXM's facts as NVML gives them.
    fn h100_sxm() -> GpuIdentity {
        GpuIdentity {
            index: 0,
            uuid: "GPU-0".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: String::new(),
            architecture: "hopper".into(),
            memory_bus_width_bits: Some(5120),
            memory_clock_max_hz: Some(2619e6),
            sm_clock_max_hz: None,
            pcie_link_gen_max: None,
            pcie_link_width_max: None,
            nvlink_links_product: Some(18),
            gpm_supported: true,
        }
    }

    #[test]
    fn hbm_peak_of_an_h100_sxm_is_3_35_terabytes_per_second() {
        let gpu = h100_sxm();
        let peak = gpu.hbm_peak_bytes_per_second().unwrap();
        assert!((peak - 3.352e12).abs() < 1e9, "{peak}");
    }

    #[test]
    fn nvlink_peak_of_an_h100_sxm_is_900_gigabytes_per_second() {
        let gpu = h100_sxm();
        assert_eq!(gpu.nvlink_peak_bytes_per_second(), Some(900e9));
        let blackwell = GpuIdentity {
            architecture: "blackwell".into(),
            ..gpu.clone()
        };
        assert_eq!(blackwell.nvlink_peak_bytes_per_second(), Some(1.8e12));
        let unknown = GpuIdentity {
            architecture: "unknown".into(),
            ..gpu.clone()
        };
        assert_eq!(unknown.nvlink_peak_bytes_per_second(), None);
        let pcie_card = GpuIdentity {
            nvlink_links_product: None,
            ..gpu
        };
        assert_eq!(pcie_card.nvlink_peak_bytes_per_second(), None);
    }

    #[test]
    fn one_process_without_mig_needs_no_driver_call_for_its_share() {
        assert!(!shares_need_the_driver(0, Some(false)));
        assert!(!shares_need_the_driver(1, Some(false)));
        assert!(shares_need_the_driver(2, Some(false)));
        // MIG on, or unknown: the GPU's utilisation is not the process's.
        assert!(shares_need_the_driver(1, Some(true)));
        assert!(shares_need_the_driver(1, None));
        assert!(!SharesRead::Skip.calls_the_driver(3, Some(false)));
        assert!(SharesRead::Always.calls_the_driver(1, Some(false)));
        assert!(!SharesRead::Always.calls_the_driver(0, None));
        assert!(!SharesRead::IfShared.calls_the_driver(1, Some(false)));
    }

    #[test]
    fn nvlink_links_by_product() {
        assert_eq!(nvlink_links_of_product("NVIDIA H100 80GB HBM3"), Some(18));
        assert_eq!(nvlink_links_of_product("NVIDIA H200"), Some(18));
        assert_eq!(nvlink_links_of_product("NVIDIA H100 PCIe"), Some(0));
        assert_eq!(nvlink_links_of_product("NVIDIA H100 NVL"), Some(12));
        assert_eq!(nvlink_links_of_product("NVIDIA H200 NVL"), Some(18));
        assert_eq!(nvlink_links_of_product("NVIDIA H800"), Some(8));
        assert_eq!(nvlink_links_of_product("NVIDIA H800 PCIe"), Some(0));
        assert_eq!(nvlink_links_of_product("NVIDIA A800-SXM4-80GB"), Some(8));
        assert_eq!(nvlink_links_of_product("NVIDIA H20"), Some(18));
        assert_eq!(nvlink_links_of_product("NVIDIA A100-SXM4-80GB"), Some(12));
        assert_eq!(nvlink_links_of_product("NVIDIA L4"), None);
    }
}
