//! Where the counts come from: the kernel's perf events behind a source
//! the tests can script, and why an event cannot be counted.

use super::*;

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

    pub(super) fn index(self) -> usize {
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

pub(super) struct KernelCounter(perf_event::Counter);

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
pub(super) fn errno_name(e: &io::Error) -> String {
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
