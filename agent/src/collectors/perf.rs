//! `perf`: hardware counters per workload cgroup (cycles, instructions,
//! last-level cache misses) from the CPU's performance monitoring unit, for
//! the detector's cycles-per-instruction signal (the CPI² method: a victim's
//! CPI rises while a neighbour takes its caches and memory bandwidth).
//!
//! Linux counts a cgroup only per CPU (`perf_event_open` with a cgroup's
//! directory and a CPU, `PERF_FLAG_PID_CGROUP`), so each cgroup costs one
//! counter per event per online CPU; a row sums them. Counters are opened for
//! the *leaves* of the cgroups that `[collectors.cgroups]` selects (its depth,
//! patterns, `max_cgroups` and rescan cadence): perf counts a cgroup's
//! descendants too (seen on this project's Linux 6.18: a counter on a parent
//! counted a process in its child), so parents would repeat what their leaves
//! hold at the price of as many counters again. Which hierarchy: cgroup v2's
//! root; on v1 the `perf_event` controller's mount, else `unified/` on a hybrid
//! system that left `perf_event` to v2. Only user mode is counted (the crate's
//! default, and what the workload's own code is slowed in).
//!
//! Counters are not grouped: the `perf-event` crate's `Group` always counts the
//! calling process, and a group's members must watch what its leader watches.
//! Each counter instead reports how long it was enabled and how long it really
//! counted; when the kernel multiplexed the PMU the two differ, and each tick's
//! increase is scaled by their ratio before it is added to the cgroup's total.
//! Totals are kept by the collector, so they only grow: a reading that went
//! backwards or is inconsistent is skipped and reported, never a panic.
//!
//! Where the kernel has no PMU (most VMs; this project's VM answers ENOENT for
//! every hardware event, while software events work) or refuses the calls
//! (`kernel.perf_event_paranoid` above 0 without CAP_PERFMON), `probe` says so
//! with the errno and what to change, and the collector stays off. The system
//! calls sit behind [`CounterSource`], so the tests drive the collector with
//! scripted counters.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

use super::cgroups::{classify, leaves, on_cgroupfs, CgroupsConfig, Selection};
use super::{Availability, Collector, Roots};

/// Default bound on open counters. Each is a file descriptor and a `struct
/// perf_event` in kernel memory (1352-byte objects in the `perf_event` slab
/// on this project's Linux 6.18), so 8192 hold the agent to about 11 MiB of
/// kernel memory and a few thousand descriptors beside its kept-open cgroup
/// files, far under the open-file limit it raises itself to. That is 2730
/// cgroup-CPUs at three events: 42 leaf cgroups on a 64-CPU node, 21 on a
/// 128-CPU one; a GPU server runs a handful of jobs.
pub const DEFAULT_MAX_COUNTERS: u32 = 8192;

/// `[collectors.perf]`. Which cgroups come from `[collectors.cgroups]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PerfConfig {
    /// Whether the collector runs (it turns itself off where the PMU is hidden).
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
    /// At most this many counters (file descriptors) are open.
    pub max_counters: u32,
}

impl Default for PerfConfig {
    fn default() -> Self {
        PerfConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            max_counters: DEFAULT_MAX_COUNTERS,
        }
    }
}

crate::collectors::common_settings!(PerfConfig);

impl crate::collectors::Registered for PerfConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn key_ranges() -> crate::keys::KeyRanges {
        KEY_RANGES
    }
    fn build(
        &self,
        all: &crate::collectors::CollectorsConfig,
        roots: &crate::collectors::Roots,
    ) -> Box<dyn crate::collectors::Collector> {
        Box::new(Perf::new(self, &all.cgroups, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        self.validate()
    }
    fn shared_settings_equal(a: &crate::collectors::CollectorsConfig, b: &crate::collectors::CollectorsConfig) -> bool {
        a.cgroups == b.cgroups
    }
}

/// Ranges of this collector's own numeric keys (at least one cgroup's counters).
pub static KEY_RANGES: crate::keys::KeyRanges = &[(
    "max_counters",
    crate::keys::KeyRange::between(3.0, 1_000_000.0),
)];

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[(
    "max_counters",
    "At most this many perf counters (one file descriptor and about 1.3 KiB of kernel memory each) are open: a cgroup takes one per event per online CPU, 3 x CPUs. Leaf cgroups past the bound are not counted and `vtax doctor` says so. The cgroups themselves are the leaves of what [collectors.cgroups] selects (max_depth, include, exclude, max_cgroups, rescan_interval_secs).",
)];

impl PerfConfig {
    /// Checks what serde cannot; the error names the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let per_cgroup = HwEvent::ALL.len() as u32;
        if !(per_cgroup..=1_000_000).contains(&self.max_counters) {
            return Err((
                "collectors.perf.max_counters".into(),
                format!(
                    "collectors.perf.max_counters = {}: must be between {per_cgroup} and 1000000",
                    self.max_counters
                ),
            ));
        }
        Ok(())
    }
}

/// A hardware event counted per cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HwEvent {
    Cycles,
    Instructions,
    LlcMisses,
}

impl HwEvent {
    /// Every event, in the order of a cgroup's totals.
    pub const ALL: [HwEvent; 3] = [HwEvent::Cycles, HwEvent::Instructions, HwEvent::LlcMisses];

    /// For messages.
    pub fn describe(self) -> &'static str {
        match self {
            HwEvent::Cycles => "CPU cycles",
            HwEvent::Instructions => "instructions",
            HwEvent::LlcMisses => "last-level cache misses",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One read of a counter: its count, and the nanoseconds it was enabled and
/// actually counting (less than enabled when the kernel shared the PMU among
/// more events than it has counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    pub count: u64,
    pub enabled_ns: u64,
    pub running_ns: u64,
}

/// An open, enabled counter.
pub trait EventCounter: Send {
    fn read(&mut self) -> io::Result<Reading>;
}

/// Opens counters: `perf_event_open` for real ([`PerfEventSource`]), scripted
/// readings in the tests (this project's VM has no PMU to count with).
pub trait CounterSource: Send {
    /// Opens and enables `event` for the tasks of the cgroup at `path` (below
    /// the hierarchy's root; `dir` is its directory) while they run on `cpu`.
    fn open(
        &mut self,
        path: &str,
        dir: &File,
        cpu: usize,
        event: HwEvent,
    ) -> io::Result<Box<dyn EventCounter>>;
}

/// The kernel's counters, through the `perf-event` crate.
pub struct PerfEventSource;

impl PerfEventSource {
    /// Opens and enables any event the crate can name on a cgroup and CPU
    /// (the tests count a software event through it where the PMU is hidden).
    pub fn open_event(
        dir: &File,
        cpu: usize,
        event: impl Into<perf_event::events::Event>,
    ) -> io::Result<Box<dyn EventCounter>> {
        let mut counter = perf_event::Builder::new()
            .kind(event)
            .observe_cgroup(dir)
            .one_cpu(cpu)
            .build()?;
        counter.enable()?;
        Ok(Box::new(KernelCounter(counter)))
    }
}

impl CounterSource for PerfEventSource {
    fn open(
        &mut self,
        _path: &str,
        dir: &File,
        cpu: usize,
        event: HwEvent,
    ) -> io::Result<Box<dyn EventCounter>> {
        use perf_event::events::Hardware;
        let kind = match event {
            HwEvent::Cycles => Hardware::CPU_CYCLES,
            HwEvent::Instructions => Hardware::INSTRUCTIONS,
            // The generic cache-miss event: the last level on Intel and most
            // others, per the kernel's event tables.
            HwEvent::LlcMisses => Hardware::CACHE_MISSES,
        };
        Self::open_event(dir, cpu, kind)
    }
}

struct KernelCounter(perf_event::Counter);

impl EventCounter for KernelCounter {
    /// Reads the three words the counter's read format holds (count, time
    /// enabled, time running) itself: the crate asserts on a reading whose
    /// times disagree, and here that is bad input to report, not a panic.
    fn read(&mut self) -> io::Result<Reading> {
        use std::os::unix::io::AsRawFd;
        let mut words = [0u64; 3];
        let want = std::mem::size_of_val(&words);
        // SAFETY: reads at most `want` bytes into `words`, which holds them.
        let n = unsafe { libc::read(self.0.as_raw_fd(), words.as_mut_ptr().cast(), want) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != want {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a perf counter read gave {n} bytes, not {want}"),
            ));
        }
        Ok(Reading {
            count: words[0],
            enabled_ns: words[1],
            running_ns: words[2],
        })
    }
}

/// The errno's name (`ENOENT`), for messages an operator can search.
fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => format!("{:?}", nix::errno::Errno::from_raw(code)),
        None => e.to_string(),
    }
}

/// Why `event` cannot be counted, and what to change, from the error of
/// `perf_event_open`. `paranoid` is `kernel.perf_event_paranoid`, if read.
pub fn unavailable_reason(event: HwEvent, e: &io::Error, paranoid: Option<i32>) -> String {
    let what = event.describe();
    let errno = errno_name(e);
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) => format!(
            "perf_event_open for {what} failed with {errno}: the kernel has no hardware PMU \
             to count with, as in most VMs; per-cgroup CPI needs bare metal or a VM that \
             exposes its PMU (KVM `-cpu host,pmu=on`, VMware virtualized CPU performance \
             counters, a cloud instance size with PMU access). The detector's cache canary \
             stands in for the memory signal"
        ),
        Some(libc::EACCES | libc::EPERM) => format!(
            "perf_event_open for {what} was refused with {errno}: counting a cgroup on every \
             CPU needs CAP_PERFMON (Linux 5.8 and later; CAP_SYS_ADMIN before) or \
             kernel.perf_event_paranoid at 0 or below (it is {}); the packaged systemd unit \
             grants CAP_PERFMON, and a container also needs perf_event_open allowed by its \
             seccomp profile",
            paranoid.map_or_else(|| "unknown".to_string(), |p| p.to_string())
        ),
        Some(libc::ENOSYS) => format!(
            "perf_event_open failed with {errno}: the kernel was built without perf events \
             (CONFIG_PERF_EVENTS)"
        ),
        Some(libc::EINVAL) => format!(
            "perf_event_open for {what} failed with {errno}: the kernel refused a cgroup \
             counter (built without CONFIG_CGROUP_PERF?)"
        ),
        Some(libc::EMFILE | libc::ENFILE) => format!(
            "perf_event_open failed with {errno}: out of file descriptors; lower \
             collectors.perf.max_counters or raise the open-file limit"
        ),
        _ => format!("perf_event_open for {what} failed with {errno}: {e}"),
    }
}

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&CGROUP_PERF];

const fn events(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::None, help)
}

vtax_store::table! {
    /// One row per counted cgroup per tick.
    pub static CGROUP_PERF: TableDef, pub struct CgroupPerfRow {
        name: "cgroup_perf",
        help: "One row per leaf workload cgroup per tick, from the CPU's hardware counters (perf_event_open in cgroup mode, one counter per event per online CPU, summed; user mode only). Counts are scaled for multiplexing, so they are estimates when the PMU was shared. No rows where the PMU is hidden (most VMs) or perf_event_open is refused.",
        tags: [
            path = TagDef {
                name: "path",
                help: "The cgroup's path below the cgroup root, as in the `cgroup` table.",
            },
            workload = TagDef {
                name: "workload",
                help: "What the cgroup holds, from its path, as in the `cgroup` table.",
            },
        ],
        fields: [
            cycles: Option<u64> = events(
                "CPU cycles while the cgroup's tasks ran (PERF_COUNT_HW_CPU_CYCLES).",
            ),
            instructions: Option<u64> = events(
                "Instructions the cgroup's tasks retired (PERF_COUNT_HW_INSTRUCTIONS); cycles / instructions is their CPI.",
            ),
            llc_misses: Option<u64> = events(
                "Last-level cache misses of the cgroup's tasks (PERF_COUNT_HW_CACHE_MISSES); null where the CPU has no such generic event.",
            ),
            counter_running_ratio: Option<f64> = FieldDef::gauge(
                FieldType::F64,
                Unit::Ratio,
                "Share of the time the cgroup's counters were enabled this tick that they counted: below 1 the PMU was shared and the increase was scaled up; null when the cgroup did not run.",
            ),
        ],
        exported: true,
    }
}

/// Online CPUs from a kernel CPU list (`0-3,8`).
fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let number = |s: &str| {
            s.parse::<usize>()
                .map_err(|_| format!("{part:?} is not a CPU or a range of CPUs"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b || b - a > 65_536 {
                    return Err(format!("{part:?} is not a range of CPUs"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(number(part)?),
        }
    }
    if cpus.is_empty() {
        return Err("no CPU listed".into());
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The hierarchy perf counts cgroups in, under `<sysfs>/fs/cgroup`, and its
/// name for messages.
fn perf_hierarchy(root: &Path) -> Result<(PathBuf, String), String> {
    if root.join("cgroup.controllers").is_file() {
        return Ok((root.to_path_buf(), "cgroup v2".into()));
    }
    let entries = std::fs::read_dir(root)
        .map_err(|e| format!("no cgroup filesystem at {}: {e}", root.display()))?;
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    if let Some(name) = names
        .iter()
        .find(|n| n.split(',').any(|c| c == "perf_event") && root.join(n).is_dir())
    {
        return Ok((root.join(name), format!("cgroup v1 {name}")));
    }
    let unified = root.join("unified");
    if unified.join("cgroup.controllers").is_file() {
        return Ok((unified, "cgroup v2 (unified, hybrid)".into()));
    }
    Err(format!(
        "no cgroup hierarchy perf can count in under {}: neither cgroup v2 nor a v1 perf_event mount",
        root.display()
    ))
}

/// One counter of a cgroup, and its last reading.
struct Slot {
    event: HwEvent,
    cpu: usize,
    counter: Box<dyn EventCounter>,
    last: Reading,
}

/// A counted cgroup.
struct Target {
    path: String,
    workload: &'static str,
    dir: PathBuf,
    /// The directory's inode when its counters were opened: another one at
    /// the same path is a cgroup made again, whose tasks those counters miss.
    inode: u64,
    slots: Vec<Slot>,
    /// Counts since the counters were opened, scaled for multiplexing; by event.
    totals: [u64; 3],
}

/// Adds one counter's increase since its last reading to `totals`; returns
/// the increase's (enabled, running) nanoseconds, or why the reading is bad.
fn advance(slot: &mut Slot, now: Reading, totals: &mut [u64; 3]) -> Result<(u64, u64), String> {
    if now.running_ns > now.enabled_ns {
        // Garbage: the next reading is measured from the last sound one.
        return Err(format!(
            "ran {} ns of {} ns enabled",
            now.running_ns, now.enabled_ns
        ));
    }
    // A reading below the last is a counter that started over: what it
    // counted since is unknown, so nothing is added and it is the new base.
    let last = std::mem::replace(&mut slot.last, now);
    let (Some(count), Some(enabled), Some(running)) = (
        now.count.checked_sub(last.count),
        now.enabled_ns.checked_sub(last.enabled_ns),
        now.running_ns.checked_sub(last.running_ns),
    ) else {
        return Err(format!("went backwards from {last:?} to {now:?}"));
    };
    let scaled = if running == 0 || running >= enabled {
        count
    } else {
        let estimate = u128::from(count) * u128::from(enabled) / u128::from(running);
        u64::try_from(estimate).unwrap_or(u64::MAX)
    };
    let total = &mut totals[slot.event.index()];
    *total = total.saturating_add(scaled);
    Ok((enabled, running))
}

/// At most this many problems of one kind are kept for `vtax doctor`.
const PROBLEMS_KEPT: usize = 5;

/// The perf collector.
pub struct Perf {
    cgroup_root: PathBuf,
    cpus_online: PathBuf,
    paranoid: PathBuf,
    selection: Selection,
    max_counters: usize,
    source: Box<dyn CounterSource>,
    /// Whether the hierarchy must be a cgroup filesystem (not in the tests'
    /// temporary trees; a fixture tree never gets counters opened).
    require_cgroupfs: bool,
    hierarchy: Option<PathBuf>,
    /// What the probe found, for the doctor.
    layout: String,
    /// The events the probe could open.
    events: Vec<HwEvent>,
    /// Why last-level cache misses are not counted, when they are not.
    llc_unavailable: Option<String>,
    cpus: Vec<usize>,
    targets: Vec<Target>,
    walked_at: Option<i64>,
    /// Leaf cgroups the last walk left out for `max_counters`.
    over_max_counters: usize,
    /// Cgroups whose counters did not open at the last walk, and why.
    open_failures: Vec<String>,
    /// Readings skipped as impossible, and the last few.
    bad_readings: u64,
    bad_reading_examples: Vec<String>,
    /// The totals of the collector this one replaced at a reload, by cgroup
    /// path with the inode they were counted for: taken up at the first
    /// walk that opens the same cgroup.
    carried_totals: BTreeMap<String, (u64, [u64; 3])>,
}

impl Perf {
    /// A perf collector counting through `perf_event_open`.
    pub fn new(config: &PerfConfig, cgroups: &CgroupsConfig, roots: &Roots) -> Self {
        Perf::with_source(config, cgroups, roots, Box::new(PerfEventSource))
    }

    /// A perf collector counting through `source`.
    pub fn with_source(
        config: &PerfConfig,
        cgroups: &CgroupsConfig,
        roots: &Roots,
        source: Box<dyn CounterSource>,
    ) -> Self {
        Perf {
            cgroup_root: roots.sys("fs/cgroup"),
            cpus_online: roots.sys("devices/system/cpu/online"),
            paranoid: roots.proc("sys/kernel/perf_event_paranoid"),
            selection: Selection::new(cgroups),
            max_counters: config.max_counters.max(1) as usize,
            source,
            require_cgroupfs: true,
            hierarchy: None,
            layout: String::new(),
            events: Vec::new(),
            llc_unavailable: None,
            cpus: Vec::new(),
            targets: Vec::new(),
            walked_at: None,
            over_max_counters: 0,
            open_failures: Vec::new(),
            bad_readings: 0,
            bad_reading_examples: Vec::new(),
            carried_totals: BTreeMap::new(),
        }
    }

    fn paranoid(&self) -> Option<i32> {
        std::fs::read_to_string(&self.paranoid)
            .ok()
            .and_then(|t| t.trim().parse().ok())
    }

    fn online_cpus(&self) -> Result<Vec<usize>, String> {
        let text = std::fs::read_to_string(&self.cpus_online)
            .map_err(|e| format!("{}: {e}", self.cpus_online.display()))?;
        parse_cpu_list(&text).map_err(|e| format!("{}: {e}", self.cpus_online.display()))
    }

    /// Finds the hierarchy and the online CPUs, and opens each event once on
    /// the hierarchy's root: the PMU answers here, before any cgroup is walked.
    fn check(&mut self) -> Result<(), String> {
        let (hierarchy, layout) = perf_hierarchy(&self.cgroup_root)?;
        if self.require_cgroupfs && !on_cgroupfs(&hierarchy) {
            return Err(format!(
                "{} is not a cgroup filesystem: perf counts cgroups only there",
                hierarchy.display()
            ));
        }
        let cpus = self.online_cpus()?;
        let dir = File::open(&hierarchy).map_err(|e| format!("{}: {e}", hierarchy.display()))?;
        let mut events = Vec::new();
        self.llc_unavailable = None;
        for event in HwEvent::ALL {
            match self.source.open("/", &dir, cpus[0], event) {
                Ok(_counter) => events.push(event),
                Err(e) => {
                    let reason = unavailable_reason(event, &e, self.paranoid());
                    if event != HwEvent::LlcMisses {
                        return Err(reason);
                    }
                    self.llc_unavailable = Some(reason);
                }
            }
        }
        self.hierarchy = Some(hierarchy);
        self.layout = layout;
        self.events = events;
        self.cpus = cpus;
        Ok(())
    }

    /// The leaf cgroups to count, in the selection's order, and how many the
    /// selection itself left out.
    fn select(&self, hierarchy: &Path) -> (Vec<String>, usize) {
        let (selected, skipped) = self
            .selection
            .bound(self.selection.list(&[hierarchy], &mut |_| {}));
        let paths: Vec<&str> = selected.iter().map(|(p, _)| p.as_str()).collect();
        let leaves = leaves(&paths);
        let chosen = selected
            .iter()
            .filter(|(p, _)| leaves.contains(p))
            .map(|(p, _)| p.clone())
            .collect();
        (chosen, skipped)
    }

    fn counters_per_cgroup(&self) -> usize {
        (self.events.len() * self.cpus.len()).max(1)
    }

    /// Walks the hierarchy: keeps the counters of cgroups found again, opens
    /// them for new ones (up to `max_counters`), closes those of the rest.
    fn rewalk(&mut self, time_us: i64) -> anyhow::Result<()> {
        let hierarchy = self.hierarchy.clone().expect("probed before collecting");
        let cpus = self.online_cpus().map_err(anyhow::Error::msg)?;
        if cpus != self.cpus {
            // CPUs came or went: every cgroup's counters are opened again on
            // the new set; the totals go on.
            self.cpus = cpus;
            for target in &mut self.targets {
                target.slots.clear();
            }
        }
        let (chosen, _) = self.select(&hierarchy);
        let room = self.max_counters / self.counters_per_cgroup();
        self.over_max_counters = chosen.len().saturating_sub(room);
        let mut old: BTreeMap<String, Target> = std::mem::take(&mut self.targets)
            .into_iter()
            .map(|t| (t.path.clone(), t))
            .collect();
        self.open_failures.clear();
        let mut refused: Option<String> = None;
        for path in chosen.into_iter().take(room) {
            let dir = hierarchy.join(path.trim_start_matches('/'));
            // The same cgroup (same inode) keeps its counters, or when the
            // CPUs changed, at least its totals.
            let previous = old
                .remove(&path)
                .filter(|t| std::fs::metadata(&t.dir).is_ok_and(|m| m.ino() == t.inode));
            let carried = match previous {
                Some(target) if !target.slots.is_empty() => {
                    self.targets.push(target);
                    continue;
                }
                Some(target) => Some((target.inode, target.totals)),
                None => self.carried_totals.remove(&path),
            };
            match self.open_target(&path, &dir) {
                Ok(Some(mut target)) => {
                    if let Some((_, totals)) = carried.filter(|(inode, _)| *inode == target.inode) {
                        target.totals = totals;
                    }
                    self.targets.push(target);
                }
                Ok(None) => {} // gone since it was listed
                Err(e) => {
                    let reason = match e.raw_os_error() {
                        Some(_) => unavailable_reason(e.event, &e.error, self.paranoid()),
                        None => e.error.to_string(),
                    };
                    if self.open_failures.len() < PROBLEMS_KEPT {
                        self.open_failures.push(format!("{path}: {reason}"));
                    }
                    let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                    refused.get_or_insert(reason);
                    if out_of_fds {
                        break; // every further cgroup would fail the same way
                    }
                }
            }
        }
        self.targets.sort_by(|a, b| a.path.cmp(&b.path));
        self.walked_at = Some(time_us);
        match refused {
            // Nothing could be counted for a reason that is not churn: the
            // tick fails with it (the PMU was taken away, the limit lowered).
            Some(reason) if self.targets.is_empty() => anyhow::bail!("{reason}"),
            _ => Ok(()),
        }
    }

    /// Opens every event on every CPU for one cgroup; `None` when its
    /// directory is gone.
    fn open_target(&mut self, path: &str, dir: &Path) -> Result<Option<Target>, OpenError> {
        let file = match File::open(dir) {
            Ok(f) => f,
            Err(e) if super::kept::is_gone(&e) => return Ok(None),
            Err(error) => {
                return Err(OpenError {
                    event: HwEvent::Cycles,
                    error,
                })
            }
        };
        let inode = match file.metadata() {
            Ok(m) => m.ino(),
            Err(error) => {
                return Err(OpenError {
                    event: HwEvent::Cycles,
                    error,
                })
            }
        };
        let mut slots = Vec::with_capacity(self.counters_per_cgroup());
        for &event in &self.events {
            for &cpu in &self.cpus {
                match self.source.open(path, &file, cpu, event) {
                    Ok(counter) => slots.push(Slot {
                        event,
                        cpu,
                        counter,
                        last: Reading::default(),
                    }),
                    // Removed between the listing and the open.
                    Err(_) if !dir.is_dir() => return Ok(None),
                    Err(error) => return Err(OpenError { event, error }),
                }
            }
        }
        Ok(Some(Target {
            path: path.to_string(),
            workload: classify(path),
            dir: dir.to_path_buf(),
            inode,
            slots,
            totals: [0; 3],
        }))
    }

    fn bad_reading(&mut self, what: String) {
        self.bad_readings += 1;
        if self.bad_reading_examples.len() >= PROBLEMS_KEPT {
            self.bad_reading_examples.remove(0);
        }
        self.bad_reading_examples.push(what);
    }

    /// Reads every counter into one row per cgroup. A cgroup gone (or made
    /// again) since its counters opened loses them and forces a walk.
    fn read_all(&mut self, time_us: i64) -> Batch {
        let mut builder = BatchBuilder::new(&CGROUP_PERF);
        let mut vanished = false;
        let mut bad = Vec::new();
        let events = &self.events;
        self.targets.retain_mut(|target| {
            let here = std::fs::metadata(&target.dir).is_ok_and(|m| m.ino() == target.inode);
            if !here {
                vanished = true;
                return false;
            }
            let (mut enabled, mut running) = (0u64, 0u64);
            for slot in &mut target.slots {
                let reading = match slot.counter.read() {
                    Ok(r) => r,
                    Err(e) => {
                        // A counter that cannot be read: the cgroup's counters
                        // are opened afresh at the next walk (its totals restart).
                        bad.push(format!(
                            "{}: reading {} on CPU {} failed: {e}",
                            target.path,
                            slot.event.describe(),
                            slot.cpu
                        ));
                        vanished = true;
                        return false;
                    }
                };
                match advance(slot, reading, &mut target.totals) {
                    Ok((e, r)) => {
                        enabled = enabled.saturating_add(e);
                        running = running.saturating_add(r);
                    }
                    Err(what) => bad.push(format!(
                        "{}: {} on CPU {} {what}; skipped",
                        target.path,
                        slot.event.describe(),
                        slot.cpu
                    )),
                }
            }
            // An event the CPU cannot count is null, not 0.
            let total = |event: HwEvent| {
                events
                    .contains(&event)
                    .then_some(target.totals[event.index()])
            };
            let row = CgroupPerfRow {
                path: &target.path,
                workload: target.workload,
                cycles: total(HwEvent::Cycles),
                instructions: total(HwEvent::Instructions),
                llc_misses: total(HwEvent::LlcMisses),
                counter_running_ratio: (enabled > 0).then(|| running as f64 / enabled as f64),
            };
            builder
                .push_row(time_us, &row)
                .expect("a perf row is for the cgroup_perf table");
            true
        });
        for what in bad {
            self.bad_reading(what);
        }
        if vanished {
            self.walked_at = None;
        }
        builder.finish()
    }
}

/// A counter that would not open, and for which event.
struct OpenError {
    event: HwEvent,
    error: io::Error,
}

impl OpenError {
    fn raw_os_error(&self) -> Option<i32> {
        self.error.raw_os_error()
    }
}

impl Collector for Perf {
    fn name(&self) -> &'static str {
        "perf"
    }

    /// Carries on each cgroup's totals: the rebuilt collector opens its
    /// counters afresh, and `vtax_cgroup_perf_*_total` would start again from
    /// zero. A cgroup made again meanwhile (another inode) starts from zero,
    /// as at a walk.
    fn take_over(&mut self, previous: Box<dyn Collector>) {
        let Ok(previous) = previous.into_any().downcast::<Perf>() else {
            return;
        };
        self.carried_totals = previous
            .targets
            .iter()
            .map(|t| (t.path.clone(), (t.inode, t.totals)))
            .collect();
    }

    fn probe(&mut self) -> Availability {
        self.targets.clear();
        self.walked_at = None;
        if let Err(reason) = self.check() {
            return Availability::Absent(reason);
        }
        let hierarchy = self.hierarchy.clone().expect("checked");
        let (chosen, _) = self.select(&hierarchy);
        let per_cgroup = self.counters_per_cgroup();
        let counted = chosen.len().min(self.max_counters / per_cgroup);
        let llc = match &self.llc_unavailable {
            None => String::new(),
            Some(_) => "; last-level cache misses not counted".into(),
        };
        Availability::Available(format!(
            "{} at {}, {counted} leaf cgroups x {} CPUs x {} events = {} counters (max_counters {}){llc}",
            self.layout,
            hierarchy.display(),
            self.cpus.len(),
            self.events.len(),
            counted * per_cgroup,
            self.max_counters,
        ))
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        if self.hierarchy.is_none() {
            anyhow::bail!("not probed");
        }
        if self.selection.rescan_due(self.walked_at, time_us) {
            self.rewalk(time_us)?;
        }
        let batch = self.read_all(time_us);
        Ok(if batch.is_empty() {
            Vec::new()
        } else {
            vec![batch]
        })
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(broken) = self.selection.broken() {
            problems.push(format!("{broken}: no cgroup is counted"));
        }
        if let Some(reason) = &self.llc_unavailable {
            problems.push(format!("last-level cache misses are not counted: {reason}"));
        }
        if self.over_max_counters > 0 {
            problems.push(format!(
                "{} leaf cgroups over collectors.perf.max_counters = {} ({} counters each: {} events x {} CPUs) are not counted: raise it, or narrow [collectors.cgroups] include/exclude",
                self.over_max_counters,
                self.max_counters,
                self.counters_per_cgroup(),
                self.events.len(),
                self.cpus.len()
            ));
        }
        for failure in &self.open_failures {
            problems.push(format!("counters did not open for {failure}"));
        }
        if self.bad_readings > 0 {
            problems.push(format!(
                "{} counter readings were impossible and skipped; the last: {}",
                self.bad_readings,
                self.bad_reading_examples.join("; ")
            ));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::collectors::testutil::{f64s, tags, u64s};

    /// What the scripted counters answer, shared with the test.
    #[derive(Default)]
    struct Script {
        readings: HashMap<(String, usize, HwEvent), Reading>,
        /// Every open of this event fails with this errno.
        refuse: HashMap<HwEvent, i32>,
        /// Reads of this cgroup's counters fail.
        unreadable: HashSet<String>,
        /// Counters open now.
        open: usize,
    }

    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<Script>>);

    impl Fake {
        fn set(
            &self,
            path: &str,
            cpu: usize,
            event: HwEvent,
            count: u64,
            enabled: u64,
            running: u64,
        ) {
            self.0.lock().unwrap().readings.insert(
                (path.into(), cpu, event),
                Reading {
                    count,
                    enabled_ns: enabled,
                    running_ns: running,
                },
            );
        }

        fn open(&self) -> usize {
            self.0.lock().unwrap().open
        }
    }

    struct FakeCounter {
        key: (String, usize, HwEvent),
        script: Arc<Mutex<Script>>,
    }

    impl EventCounter for FakeCounter {
        fn read(&mut self) -> io::Result<Reading> {
            let script = self.script.lock().unwrap();
            if script.unreadable.contains(&self.key.0) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            Ok(script.readings.get(&self.key).copied().unwrap_or_default())
        }
    }

    impl Drop for FakeCounter {
        fn drop(&mut self) {
            self.script.lock().unwrap().open -= 1;
        }
    }

    impl CounterSource for Fake {
        fn open(
            &mut self,
            path: &str,
            _dir: &File,
            cpu: usize,
            event: HwEvent,
        ) -> io::Result<Box<dyn EventCounter>> {
            let mut script = self.0.lock().unwrap();
            if let Some(&errno) = script.refuse.get(&event) {
                return Err(io::Error::from_raw_os_error(errno));
            }
            script.open += 1;
            Ok(Box::new(FakeCounter {
                key: (path.into(), cpu, event),
                script: self.0.clone(),
            }))
        }
    }

    /// A cgroup v2 tree on two CPUs with `/system.slice/{a,b}.service` and
    /// `/user.slice`, and perf_event_paranoid 2.
    fn tree() -> (tempfile::TempDir, Roots) {
        let dir = tempfile::tempdir().unwrap();
        let cgroup = dir.path().join("sys/fs/cgroup");
        for d in [
            "system.slice/a.service",
            "system.slice/b.service",
            "user.slice",
        ] {
            std::fs::create_dir_all(cgroup.join(d)).unwrap();
        }
        std::fs::write(cgroup.join("cgroup.controllers"), "cpu memory\n").unwrap();
        let cpu = dir.path().join("sys/devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), "0-1\n").unwrap();
        let kernel = dir.path().join("proc/sys/kernel");
        std::fs::create_dir_all(&kernel).unwrap();
        std::fs::write(kernel.join("perf_event_paranoid"), "2\n").unwrap();
        let roots = Roots {
            procfs: dir.path().join("proc"),
            sysfs: dir.path().join("sys"),
            ..Roots::default()
        };
        (dir, roots)
    }

    fn collector(roots: &Roots, config: &PerfConfig, cgroups: &CgroupsConfig, fake: &Fake) -> Perf {
        let mut perf = Perf::with_source(config, cgroups, roots, Box::new(fake.clone()));
        perf.require_cgroupfs = false; // a temporary directory stands in for cgroupfs
        perf
    }

    /// A collector with the default settings over `roots`, probed, and what
    /// the probe found.
    fn probed(roots: &Roots, fake: &Fake) -> (Perf, String) {
        let mut perf = collector(
            roots,
            &PerfConfig::default(),
            &CgroupsConfig::default(),
            fake,
        );
        match perf.probe() {
            Availability::Available(summary) => (perf, summary),
            Availability::Absent(reason) | Availability::Failed(reason) => {
                panic!("absent with a working PMU: {reason}")
            }
        }
    }

    fn collect_one(perf: &mut Perf, time_us: i64) -> Batch {
        let mut batches = perf.collect(time_us).unwrap();
        assert_eq!(batches.len(), 1);
        batches.pop().unwrap()
    }

    fn row_of(batch: &Batch, path: &str) -> usize {
        let paths = tags(batch, "path");
        paths
            .iter()
            .position(|p| p == path)
            .unwrap_or_else(|| panic!("no row for {path}: {paths:?}"))
    }

    fn count(batch: &Batch, path: &str, field: &str) -> Option<u64> {
        u64s(batch, field)[row_of(batch, path)]
    }

    const A: &str = "/system.slice/a.service";
    const B: &str = "/system.slice/b.service";
    const USER: &str = "/user.slice";

    #[test]
    fn the_table_follows_the_naming_rules() {
        CGROUP_PERF.validate().unwrap();
        let names: Vec<&str> = CGROUP_PERF.fields.iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            [
                "cycles",
                "instructions",
                "llc_misses",
                "counter_running_ratio"
            ]
        );
        assert_eq!(
            CGROUP_PERF.metric_name(&CGROUP_PERF.fields[0]),
            "vtax_cgroup_perf_cycles_total"
        );
    }

    /// A reload that changes the perf settings rebuilds the collector: the
    /// new one opens its counters afresh and carries on each cgroup's totals.
    #[test]
    fn a_rebuilt_collector_carries_on_the_totals() {
        let (_dir, roots) = tree();
        let fake = Fake::default();
        let (mut old, _) = probed(&roots, &fake);
        collect_one(&mut old, 0);
        fake.set(A, 0, HwEvent::Cycles, 1000, 100, 100);
        let before = collect_one(&mut old, 1_000_000);
        assert_eq!(count(&before, A, "cycles"), Some(1000));
        let mut new = collector(
            &roots,
            &PerfConfig {
                max_counters: 4096,
                ..PerfConfig::default()
            },
            &CgroupsConfig::default(),
            &fake,
        );
        new.take_over(Box::new(old));
        assert!(matches!(new.probe(), Availability::Available(_)));
        // The fake's counters read their script's value since they opened:
        // the new ones count 1000 on top of the 1000 carried, not from 0.
        let after = collect_one(&mut new, 2_000_000);
        assert_eq!(count(&after, A, "cycles"), Some(2000));
        fake.set(A, 0, HwEvent::Cycles, 1500, 200, 200);
        let later = collect_one(&mut new, 3_000_000);
        assert_eq!(count(&later, A, "cycles"), Some(2500));
    }

    #[test]
    fn leaf_cgroups_sum_their_cpus_and_scale_for_multiplexing() {
        let (_dir, roots) = tree();
        let fake = Fake::default();
        let (mut perf, summary) = probed(&roots, &fake);
        assert!(
            summary
                .ends_with("3 leaf cgroups x 2 CPUs x 3 events = 18 counters (max_counters 8192)"),
            "{summary}"
        );
        assert_eq!(fake.open(), 0, "the probe's own counters are closed");
        let first = collect_one(&mut perf, 0);
        assert_eq!(
            tags(&first, "path"),
            [A, B, USER],
            "leaves only, in path order"
        );
        assert_eq!(tags(&first, "workload"), ["service", "service", "slice"]);
        assert_eq!(fake.open(), 18);
        assert_eq!(count(&first, A, "cycles"), Some(0));
        assert_eq!(f64s(&first, "counter_running_ratio"), [None, None, None]);

        // CPU 0 counted all the time; CPU 1 had the PMU half of it.
        fake.set(A, 0, HwEvent::Cycles, 1000, 100, 100);
        fake.set(A, 1, HwEvent::Cycles, 500, 100, 50);
        fake.set(A, 0, HwEvent::Instructions, 2000, 100, 100);
        fake.set(A, 0, HwEvent::LlcMisses, 7, 100, 100);
        let second = collect_one(&mut perf, 1_000_000);
        assert_eq!(count(&second, A, "cycles"), Some(2000));
        assert_eq!(count(&second, A, "instructions"), Some(2000));
        assert_eq!(count(&second, A, "llc_misses"), Some(7));
        let ratio = f64s(&second, "counter_running_ratio")[row_of(&second, A)].unwrap();
        assert!((ratio - 350.0 / 400.0).abs() < 1e-12, "{ratio}");
        assert_eq!(count(&second, B, "cycles"), Some(0));

        // The next increase is scaled by its own times: 300 counted in 50 of 100 ns.
        fake.set(A, 1, HwEvent::Cycles, 800, 200, 100);
        let third = collect_one(&mut perf, 2_000_000);
        assert_eq!(count(&third, A, "cycles"), Some(2600));
        assert_eq!(count(&third, A, "instructions"), Some(2000));
        assert!(perf.problems().is_empty(), "{:?}", perf.problems());
    }

    #[test]
    fn a_refused_pmu_disables_the_collector_with_the_errno_and_the_remedy() {
        let cases: [(i32, &[&str]); 5] = [
            (
                libc::ENOENT,
                &["CPU cycles", "ENOENT", "no hardware PMU", "pmu=on"],
            ),
            (libc::EOPNOTSUPP, &["EOPNOTSUPP", "no hardware PMU"]),
            (
                libc::EACCES,
                &[
                    "EACCES",
                    "CAP_PERFMON",
                    "kernel.perf_event_paranoid",
                    "(it is 2)",
                ],
            ),
            (libc::EPERM, &["EPERM", "CAP_PERFMON", "seccomp"]),
            (libc::ENOSYS, &["ENOSYS", "CONFIG_PERF_EVENTS"]),
        ];
        for (errno, words) in cases {
            let (_dir, roots) = tree();
            let fake = Fake::default();
            fake.0.lock().unwrap().refuse.insert(HwEvent::Cycles, errno);
            let mut perf = collector(
                &roots,
                &PerfConfig::default(),
                &CgroupsConfig::default(),
                &fake,
            );
            let Availability::Absent(reason) = perf.probe() else {
                panic!("available although cycles fail with {errno}");
            };
            for word in words {
                assert!(reason.contains(word), "{word:?} not in {reason:?}");
            }
            assert_eq!(fake.open(), 0);
            assert!(
                perf.collect(0).is_err(),
                "an unprobed collector reads nothing"
            );
        }
    }

    #[test]
    fn without_an_llc_event_the_rest_is_counted_and_llc_misses_are_null() {
        let (_dir, roots) = tree();
        let fake = Fake::default();
        fake.0
            .lock()
            .unwrap()
            .refuse
            .insert(HwEvent::LlcMisses, libc::ENOENT);
        let (mut perf, summary) = probed(&roots, &fake);
        assert!(
            summary.contains("x 2 events = 12 counters")
                && summary.ends_with("last-level cache misses not counted"),
            "{summary}"
        );
        fake.set(A, 0, HwEvent::Instructions, 10, 1, 1);
        let batch = collect_one(&mut perf, 0);
        assert_eq!(count(&batch, A, "llc_misses"), None);
        assert_eq!(count(&batch, A, "instructions"), Some(10));
        assert_eq!(fake.open(), 12);
        let problems = perf.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("last-level cache misses are not counted: perf_event_open for last-level cache misses failed with ENOENT"), "{problems:?}");
    }

    #[test]
    fn cgroups_that_come_go_or_are_made_again_are_followed() {
        let (_dir, roots) = tree();
        let cgroup = roots.sys("fs/cgroup");
        let fake = Fake::default();
        let cgroups = CgroupsConfig {
            rescan_interval_secs: 10.0,
            ..CgroupsConfig::default()
        };
        let mut perf = collector(&roots, &PerfConfig::default(), &cgroups, &fake);
        assert!(matches!(perf.probe(), Availability::Available(_)));
        assert_eq!(collect_one(&mut perf, 0).len(), 3);

        // A new cgroup waits for the rescan; a new child makes its parent no leaf.
        std::fs::create_dir_all(cgroup.join("user.slice/session-1.scope")).unwrap();
        assert_eq!(collect_one(&mut perf, 5_000_000).len(), 3);
        let rescanned = collect_one(&mut perf, 10_000_000);
        assert_eq!(
            tags(&rescanned, "path"),
            [A, B, "/user.slice/session-1.scope"]
        );
        assert_eq!(fake.open(), 18, "the parent's counters were closed");

        // A cgroup removed between ticks loses its row and its counters at once.
        fake.set(A, 0, HwEvent::Cycles, 40, 1, 1);
        assert_eq!(
            count(&collect_one(&mut perf, 11_000_000), A, "cycles"),
            Some(40)
        );
        std::fs::remove_dir(cgroup.join("system.slice/b.service")).unwrap();
        let after = collect_one(&mut perf, 12_000_000);
        assert_eq!(tags(&after, "path"), [A, "/user.slice/session-1.scope"]);
        assert_eq!(fake.open(), 12);
        collect_one(&mut perf, 12_500_000); // the walk the vanished cgroup asked for

        // a.service made again at its path (a restarted unit): its old counters
        // watch a cgroup that is gone, so they are dropped and opened afresh.
        let fresh = cgroup.join("system.slice/a.service.new");
        std::fs::create_dir(&fresh).unwrap();
        std::fs::remove_dir(cgroup.join("system.slice/a.service")).unwrap();
        std::fs::rename(&fresh, cgroup.join("system.slice/a.service")).unwrap();
        let gap = collect_one(&mut perf, 13_000_000);
        assert_eq!(tags(&gap, "path"), ["/user.slice/session-1.scope"]);
        let again = collect_one(&mut perf, 14_000_000);
        assert_eq!(tags(&again, "path"), [A, "/user.slice/session-1.scope"]);
        // The script still answers 40 for a.service's CPU 0: the new counter
        // counts from its own start, which the totals take as a fresh series.
        assert_eq!(count(&again, A, "cycles"), Some(40));
        assert_eq!(fake.open(), 12);
    }

    #[test]
    fn cpus_coming_online_reopen_the_counters_and_the_totals_go_on() {
        let (_dir, roots) = tree();
        let fake = Fake::default();
        let (mut perf, _) = probed(&roots, &fake);
        fake.set(A, 1, HwEvent::Cycles, 500, 10, 10);
        assert_eq!(count(&collect_one(&mut perf, 0), A, "cycles"), Some(500));
        std::fs::write(roots.sys("devices/system/cpu/online"), "0-2\n").unwrap();
        // At the rescan: three CPUs' counters, the old ones closed; the new
        // counter on CPU 1 starts from nothing, its script still says 500.
        let batch = collect_one(&mut perf, 10_000_000);
        assert_eq!(fake.open(), 27);
        assert_eq!(count(&batch, A, "cycles"), Some(1000));
        fake.set(A, 2, HwEvent::Cycles, 70, 10, 10);
        let batch = collect_one(&mut perf, 11_000_000);
        assert_eq!(count(&batch, A, "cycles"), Some(1070));
    }

    #[test]
    fn max_counters_bounds_the_open_counters_and_says_so() {
        let (_dir, roots) = tree();
        let fake = Fake::default();
        let config = PerfConfig {
            max_counters: 12,
            ..PerfConfig::default()
        };
        let mut perf = collector(&roots, &config, &CgroupsConfig::default(), &fake);
        let Availability::Available(summary) = perf.probe() else {
            panic!("absent");
        };
        assert!(
            summary.contains("2 leaf cgroups x 2 CPUs x 3 events = 12 counters"),
            "{summary}"
        );
        let batch = collect_one(&mut perf, 0);
        // Shallowest first, as the cgroups collector bounds its own.
        assert_eq!(tags(&batch, "path"), [A, USER]);
        assert_eq!(fake.open(), 12);
        assert_eq!(
            perf.problems(),
            ["1 leaf cgroups over collectors.perf.max_counters = 12 (6 counters each: 3 events x 2 CPUs) are not counted: raise it, or narrow [collectors.cgroups] include/exclude"]
        );
    }

    #[test]
    fn impossible_readings_are_skipped_and_reported() {
        let (_dir, roots) = tree();
        let fake = Fake::default();
        let (mut perf, _) = probed(&roots, &fake);
        fake.set(A, 0, HwEvent::Cycles, 1000, 100, 100);
        collect_one(&mut perf, 0);
        // Backwards, then running longer than enabled: neither moves the total.
        fake.set(A, 0, HwEvent::Cycles, 400, 150, 150);
        assert_eq!(
            count(&collect_one(&mut perf, 1_000_000), A, "cycles"),
            Some(1000)
        );
        fake.set(A, 0, HwEvent::Cycles, 900, 200, 300);
        assert_eq!(
            count(&collect_one(&mut perf, 2_000_000), A, "cycles"),
            Some(1000)
        );
        // Sound again: counted from the last sound reading (400, 150, 150) on.
        fake.set(A, 0, HwEvent::Cycles, 1100, 250, 250);
        assert_eq!(
            count(&collect_one(&mut perf, 3_000_000), A, "cycles"),
            Some(1700)
        );
        let problems = perf.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("2 counter readings were impossible and skipped"),
            "{problems:?}"
        );
        assert!(
            problems[0].contains("CPU cycles on CPU 0 went backwards"),
            "{problems:?}"
        );
        assert!(
            problems[0].contains("ran 300 ns of 200 ns enabled"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_counter_that_cannot_be_read_is_opened_again() {
        let (_dir, roots) = tree();
        let fake = Fake::default();
        let (mut perf, _) = probed(&roots, &fake);
        collect_one(&mut perf, 0);
        fake.0.lock().unwrap().unreadable.insert(B.into());
        let batch = collect_one(&mut perf, 1_000_000);
        assert_eq!(tags(&batch, "path"), [A, USER]);
        assert_eq!(fake.open(), 12, "b.service's counters were closed");
        assert!(perf.problems()[0].contains("reading CPU cycles on CPU 0 failed"));
        fake.0.lock().unwrap().unreadable.clear();
        let batch = collect_one(&mut perf, 2_000_000);
        assert_eq!(tags(&batch, "path"), [A, B, USER]);
        assert_eq!(fake.open(), 18);
    }

    #[test]
    fn cpu_lists_read_like_the_kernels() {
        assert_eq!(parse_cpu_list("0-3,8\n").unwrap(), [0, 1, 2, 3, 8]);
        assert_eq!(parse_cpu_list("5").unwrap(), [5]);
        for bad in ["", "\n", "a", "3-1", "0-", "1,x"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_hierarchy_is_v2_the_v1_perf_event_mount_or_unified() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert!(perf_hierarchy(&root.join("none"))
            .unwrap_err()
            .contains("no cgroup filesystem"));
        std::fs::create_dir_all(root.join("memory")).unwrap();
        assert!(perf_hierarchy(root)
            .unwrap_err()
            .contains("nor a v1 perf_event mount"));
        std::fs::create_dir_all(root.join("unified")).unwrap();
        std::fs::write(root.join("unified/cgroup.controllers"), "").unwrap();
        assert_eq!(perf_hierarchy(root).unwrap().0, root.join("unified"));
        std::fs::create_dir_all(root.join("net_cls,perf_event")).unwrap();
        assert_eq!(
            perf_hierarchy(root).unwrap().0,
            root.join("net_cls,perf_event")
        );
        std::fs::write(root.join("cgroup.controllers"), "cpu\n").unwrap();
        assert_eq!(perf_hierarchy(root).unwrap().0, root);
    }

    #[test]
    fn max_counters_below_one_cgroups_worth_is_refused() {
        let bad = PerfConfig {
            max_counters: 2,
            ..PerfConfig::default()
        };
        let (key, message) = bad.validate().unwrap_err();
        assert_eq!(key, "collectors.perf.max_counters");
        assert!(
            message.starts_with("collectors.perf.max_counters = 2"),
            "{message}"
        );
        assert!(PerfConfig::default().validate().is_ok());
    }

    /// Whether sysfs lists a core PMU (x86 `cpu`, hybrid `cpu_core`, Arm `armv8_*`).
    fn core_pmu_listed() -> bool {
        std::fs::read_dir("/sys/bus/event_source/devices").is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                name == "cpu" || name.starts_with("cpu_") || name.starts_with("armv")
            })
        })
    }

    /// The real `perf_event_open` on this machine: counters, or the clean
    /// reason. Without a core PMU (this project's VM) it must be the reason.
    #[test]
    fn the_real_opener_counts_or_says_why() {
        let mut perf = Perf::new(
            &PerfConfig::default(),
            &CgroupsConfig::default(),
            &Roots::default(),
        );
        match perf.probe() {
            Availability::Available(summary) => {
                assert!(
                    core_pmu_listed(),
                    "counting without a PMU in sysfs: {summary}"
                );
                let batches = perf.collect(crate::timespec::now_us()).unwrap();
                assert!(batches.iter().all(|b| std::ptr::eq(b.table, &CGROUP_PERF)));
            }
            Availability::Absent(reason) => {
                eprintln!("perf on this machine: {reason}");
                let clean = [
                    "failed with ENOENT",
                    "failed with EOPNOTSUPP",
                    "failed with ENODEV",
                    "refused with EACCES",
                    "refused with EPERM",
                    "no cgroup",
                    "is not a cgroup filesystem",
                ];
                assert!(clean.iter().any(|c| reason.contains(c)), "{reason}");
                if !core_pmu_listed() && reason.starts_with("perf_event_open") {
                    assert!(
                        ["ENOENT", "EOPNOTSUPP", "ENODEV", "EACCES", "EPERM"]
                            .iter()
                            .any(|e| reason.contains(e)),
                        "{reason}"
                    );
                }
            }
            Availability::Failed(reason) => panic!("perf never reports a failed source: {reason}"),
        }
    }

    /// The real opener's plumbing (cgroup directory, one counter per CPU,
    /// enable, the three-word read) with a software event, which needs no
    /// PMU: the hierarchy's root cgroup holds this test, so its busy loop counts.
    #[test]
    fn a_software_event_on_the_root_cgroup_counts_this_process() {
        let roots = Roots::default();
        let Ok((hierarchy, _)) = perf_hierarchy(&roots.sys("fs/cgroup")) else {
            panic!("no cgroup hierarchy on this machine to count in");
        };
        let dir = File::open(&hierarchy).unwrap();
        let cpus = parse_cpu_list(
            &std::fs::read_to_string(roots.sys("devices/system/cpu/online")).unwrap(),
        )
        .unwrap();
        let mut counters = Vec::new();
        for &cpu in &cpus {
            match PerfEventSource::open_event(&dir, cpu, perf_event::events::Software::CPU_CLOCK) {
                Ok(c) => counters.push(c),
                Err(e) => {
                    // Not privileged: the refusal must be the one the probe explains.
                    let errno = e.raw_os_error();
                    assert!(matches!(errno, Some(libc::EACCES | libc::EPERM)), "{e}");
                    return;
                }
            }
        }
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let mut ns = 0;
        for counter in &mut counters {
            let r = counter.read().unwrap();
            assert!(r.running_ns <= r.enabled_ns, "{r:?}");
            ns += r.count;
        }
        assert!(
            ns >= 40_000_000,
            "the root cgroup ran {ns} ns of CPU clock in 50 ms of spinning"
        );
    }
}
