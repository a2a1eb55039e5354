//! What a cgroup's files hold: which file fills which field of its row, key by
//! key, for each layout, and the parsers of their text.

use super::*;

pub(super) fn error(path: &Path, line: usize, reason: impl Into<String>) -> ParseError {
    ParseError {
        path: path.display().to_string(),
        line,
        reason: reason.into(),
    }
}

/// One file a cgroup's row is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    // cgroup v2
    CpuStatV2,
    CpuMax,
    MemoryCurrent,
    MemoryMax,
    MemoryStatV2,
    MemoryEvents,
    SwapCurrent,
    // v2, and v1's `unified/` on hybrid systems
    CpuPressure,
    MemoryPressure,
    IoPressure,
    IoStat,
    // cgroup v1 cpu
    CpuStatV1,
    CfsQuota,
    CfsPeriod,
    // cgroup v1 cpuacct
    CpuacctUsage,
    CpuacctStat,
    // cgroup v1 memory
    MemoryUsage,
    MemoryLimit,
    MemoryStatV1,
    OomControl,
    KmemUsage,
}

pub(super) const V2_SOURCES: &[Source] = &[
    Source::CpuStatV2,
    Source::CpuMax,
    Source::MemoryCurrent,
    Source::MemoryMax,
    Source::MemoryStatV2,
    Source::MemoryEvents,
    Source::SwapCurrent,
    Source::CpuPressure,
    Source::MemoryPressure,
    Source::IoPressure,
    Source::IoStat,
];

pub(super) const PRESSURE_SOURCES: &[Source] = &[
    Source::CpuPressure,
    Source::MemoryPressure,
    Source::IoPressure,
];

pub(super) const CPU_SOURCES: &[Source] = &[Source::CpuStatV1, Source::CfsQuota, Source::CfsPeriod];

pub(super) const CPUACCT_SOURCES: &[Source] = &[Source::CpuacctUsage, Source::CpuacctStat];

pub(super) const MEMORY_SOURCES: &[Source] = &[
    Source::MemoryUsage,
    Source::MemoryLimit,
    Source::MemoryStatV1,
    Source::OomControl,
    Source::KmemUsage,
];

/// A field of [`CgroupRow`] that a file's number fills.
pub(super) type U64Field = for<'r, 'a> fn(&'r mut CgroupRow<'a>) -> &'r mut Option<u64>;

/// A field of [`CgroupRow`] that a file's number fills, scaled.
pub(super) type F64Field = for<'r, 'a> fn(&'r mut CgroupRow<'a>) -> &'r mut Option<f64>;

/// The field a file's key fills, and how the number written becomes its value.
#[derive(Clone, Copy)]
pub(super) enum Fill {
    /// A count or a size in bytes, as written.
    Count(U64Field),
    /// Seconds, written in microseconds.
    Micros(F64Field),
    /// Seconds, written in nanoseconds.
    Nanos(F64Field),
    /// Seconds, written in clock ticks (USER_HZ).
    Ticks(F64Field),
    /// CPUs, from a quota and a period: set by the parser of the file (or of
    /// the pair of files) that holds both.
    Cpus(F64Field),
}

impl Fill {
    /// Sets the field from the number `n` the file writes; `hz` is USER_HZ.
    /// A [`Fill::Cpus`] takes `n` as whole CPUs.
    pub(super) fn set(self, row: &mut CgroupRow, n: u64, hz: f64) {
        match self {
            Fill::Count(field) => *field(row) = Some(n),
            Fill::Micros(field) => *field(row) = Some(n as f64 / MICROS),
            Fill::Nanos(field) => *field(row) = Some(n as f64 / NANOS),
            Fill::Ticks(field) => *field(row) = Some(n as f64 / hz),
            Fill::Cpus(field) => *field(row) = Some(n as f64),
        }
    }

    /// Copies the field of `from` into `to`.
    pub(super) fn copy(self, from: &mut CgroupRow, to: &mut CgroupRow) {
        match self {
            Fill::Count(field) => *field(to) = *field(from),
            Fill::Micros(field) | Fill::Nanos(field) | Fill::Ticks(field) | Fill::Cpus(field) => {
                *field(to) = *field(from)
            }
        }
    }

    /// Sets the field to null.
    pub(super) fn clear(self, row: &mut CgroupRow) {
        match self {
            Fill::Count(field) => *field(row) = None,
            Fill::Micros(field) | Fill::Nanos(field) | Fill::Ticks(field) | Fill::Cpus(field) => {
                *field(row) = None
            }
        }
    }
}

// What each file fills, key by key (see `Source::fills`): a one-value file's
// key is empty, a pressure file's are its line kinds, `some` and `full`.

pub(super) static CPU_STAT_V2: &[(&str, Fill)] = &[
    ("usage_usec", Fill::Micros(|r| &mut r.cpu_usage_seconds)),
    ("user_usec", Fill::Micros(|r| &mut r.cpu_user_seconds)),
    ("system_usec", Fill::Micros(|r| &mut r.cpu_system_seconds)),
    ("nr_periods", Fill::Count(|r| &mut r.cpu_periods)),
    (
        "nr_throttled",
        Fill::Count(|r| &mut r.cpu_throttled_periods),
    ),
    (
        "throttled_usec",
        Fill::Micros(|r| &mut r.cpu_throttled_seconds),
    ),
];

pub(super) static CPU_STAT_V1: &[(&str, Fill)] = &[
    ("nr_periods", Fill::Count(|r| &mut r.cpu_periods)),
    (
        "nr_throttled",
        Fill::Count(|r| &mut r.cpu_throttled_periods),
    ),
    (
        "throttled_time",
        Fill::Nanos(|r| &mut r.cpu_throttled_seconds),
    ),
];

pub(super) static CPUACCT_USAGE: &[(&str, Fill)] = &[("", Fill::Nanos(|r| &mut r.cpu_usage_seconds))];

pub(super) static CPUACCT_STAT: &[(&str, Fill)] = &[
    ("user", Fill::Ticks(|r| &mut r.cpu_user_seconds)),
    ("system", Fill::Ticks(|r| &mut r.cpu_system_seconds)),
];

pub(super) static CPU_MAX: &[(&str, Fill)] = &[("", Fill::Cpus(|r| &mut r.cpu_quota_cpus))];

pub(super) static MEMORY_USAGE: &[(&str, Fill)] = &[("", Fill::Count(|r| &mut r.memory_usage_bytes))];

pub(super) static MEMORY_LIMIT: &[(&str, Fill)] = &[("", Fill::Count(|r| &mut r.memory_limit_bytes))];

pub(super) static SWAP_USAGE: &[(&str, Fill)] = &[("", Fill::Count(|r| &mut r.memory_swap_bytes))];

pub(super) static KMEM_USAGE: &[(&str, Fill)] = &[("", Fill::Count(|r| &mut r.memory_kernel_bytes))];

pub(super) static MEMORY_STAT_V2: &[(&str, Fill)] = &[
    ("anon", Fill::Count(|r| &mut r.memory_anon_bytes)),
    ("file", Fill::Count(|r| &mut r.memory_file_bytes)),
    ("kernel", Fill::Count(|r| &mut r.memory_kernel_bytes)),
    ("slab", Fill::Count(|r| &mut r.memory_slab_bytes)),
    ("pgfault", Fill::Count(|r| &mut r.memory_page_faults)),
    (
        "pgmajfault",
        Fill::Count(|r| &mut r.memory_major_page_faults),
    ),
];

pub(super) static MEMORY_STAT_V1: &[(&str, Fill)] = &[
    ("total_rss", Fill::Count(|r| &mut r.memory_anon_bytes)),
    ("total_cache", Fill::Count(|r| &mut r.memory_file_bytes)),
    ("total_swap", Fill::Count(|r| &mut r.memory_swap_bytes)),
    ("total_pgfault", Fill::Count(|r| &mut r.memory_page_faults)),
    (
        "total_pgmajfault",
        Fill::Count(|r| &mut r.memory_major_page_faults),
    ),
];

pub(super) static MEMORY_EVENTS: &[(&str, Fill)] = &[
    ("max", Fill::Count(|r| &mut r.memory_max_events)),
    ("oom", Fill::Count(|r| &mut r.memory_oom_events)),
    ("oom_kill", Fill::Count(|r| &mut r.memory_oom_kills)),
];

pub(super) static OOM_CONTROL: &[(&str, Fill)] = &[("oom_kill", Fill::Count(|r| &mut r.memory_oom_kills))];

pub(super) static CPU_PRESSURE: &[(&str, Fill)] = &[
    ("some", Fill::Micros(|r| &mut r.cpu_pressure_some_seconds)),
    ("full", Fill::Micros(|r| &mut r.cpu_pressure_full_seconds)),
];

pub(super) static MEMORY_PRESSURE: &[(&str, Fill)] = &[
    (
        "some",
        Fill::Micros(|r| &mut r.memory_pressure_some_seconds),
    ),
    (
        "full",
        Fill::Micros(|r| &mut r.memory_pressure_full_seconds),
    ),
];

pub(super) static IO_PRESSURE: &[(&str, Fill)] = &[
    ("some", Fill::Micros(|r| &mut r.io_pressure_some_seconds)),
    ("full", Fill::Micros(|r| &mut r.io_pressure_full_seconds)),
];

// Per device lines, summed: `MAJ:MIN rbytes=N wbytes=N rios=N ...`. v1's
// blkio.throttle.io_service_bytes_recursive is not read: Linux 6.18 lists no
// device there for a cgroup without throttle rules (200 MiB of direct writes
// read as 0), and with a rule it counted them as discards.
pub(super) static IO_STAT: &[(&str, Fill)] = &[
    ("rbytes", Fill::Count(|r| &mut r.io_read_bytes)),
    ("wbytes", Fill::Count(|r| &mut r.io_write_bytes)),
];

impl Source {
    /// Whether the file is a setting (a limit) rather than a measurement: read
    /// at each rescan only, not on every tick.
    pub(super) fn is_setting(self) -> bool {
        matches!(
            self,
            Source::CpuMax
                | Source::MemoryMax
                | Source::CfsQuota
                | Source::CfsPeriod
                | Source::MemoryLimit
        )
    }

    /// Whether the file's values move only when the cgroup's tasks run or its
    /// memory charge moves: page faults, charges, reclaim and throttling all
    /// need one or the other. A quiet cgroup (CPU time and memory usage as at
    /// its last full read) repeats these values instead of reading the file.
    pub(super) fn follows_usage(self) -> bool {
        matches!(
            self,
            Source::MemoryStatV2
                | Source::MemoryEvents
                | Source::SwapCurrent
                | Source::CpuStatV1
                | Source::CpuacctStat
                | Source::MemoryStatV1
                | Source::OomControl
                | Source::KmemUsage
        )
    }

    /// The keys the file is read by and the field each fills (settings that
    /// are combined later fill none directly).
    pub(super) fn fills(self) -> &'static [(&'static str, Fill)] {
        match self {
            Source::CpuStatV2 => CPU_STAT_V2,
            Source::CpuMax => CPU_MAX,
            Source::MemoryCurrent | Source::MemoryUsage => MEMORY_USAGE,
            Source::MemoryMax | Source::MemoryLimit => MEMORY_LIMIT,
            Source::MemoryStatV2 => MEMORY_STAT_V2,
            Source::MemoryEvents => MEMORY_EVENTS,
            Source::SwapCurrent => SWAP_USAGE,
            Source::CpuPressure => CPU_PRESSURE,
            Source::MemoryPressure => MEMORY_PRESSURE,
            Source::IoPressure => IO_PRESSURE,
            Source::IoStat => IO_STAT,
            Source::CpuStatV1 => CPU_STAT_V1,
            Source::CfsQuota | Source::CfsPeriod => &[],
            Source::CpuacctUsage => CPUACCT_USAGE,
            Source::CpuacctStat => CPUACCT_STAT,
            Source::MemoryStatV1 => MEMORY_STAT_V1,
            Source::OomControl => OOM_CONTROL,
            Source::KmemUsage => KMEM_USAGE,
        }
    }

    pub(super) fn file_name(self) -> &'static str {
        match self {
            Source::CpuStatV2 | Source::CpuStatV1 => "cpu.stat",
            Source::CpuMax => "cpu.max",
            Source::MemoryCurrent => "memory.current",
            Source::MemoryMax => "memory.max",
            Source::MemoryStatV2 | Source::MemoryStatV1 => "memory.stat",
            Source::MemoryEvents => "memory.events",
            Source::SwapCurrent => "memory.swap.current",
            Source::CpuPressure => "cpu.pressure",
            Source::MemoryPressure => "memory.pressure",
            Source::IoPressure => "io.pressure",
            Source::IoStat => "io.stat",
            Source::CfsQuota => "cpu.cfs_quota_us",
            Source::CfsPeriod => "cpu.cfs_period_us",
            Source::CpuacctUsage => "cpuacct.usage",
            Source::CpuacctStat => "cpuacct.stat",
            Source::MemoryUsage => "memory.usage_in_bytes",
            Source::MemoryLimit => "memory.limit_in_bytes",
            Source::OomControl => "memory.oom_control",
            Source::KmemUsage => "memory.kmem.usage_in_bytes",
        }
    }
}

/// Values of one row while its files are read.
pub(super) struct Row {
    /// The fields read so far; the tags are filled when the row is pushed.
    pub(super) values: CgroupRow<'static>,
    /// v1: cpu.cfs_quota_us and cpu.cfs_period_us, combined once both are read.
    pub(super) quota_us: Option<i64>,
    pub(super) period_us: Option<u64>,
}

impl Row {
    pub(super) fn new() -> Row {
        Row {
            values: CgroupRow::default(),
            quota_us: None,
            period_us: None,
        }
    }

    /// Drops what `source` filled, after it read badly part way.
    pub(super) fn forget(&mut self, source: Source) {
        for (_, fill) in source.fills() {
            fill.clear(&mut self.values);
        }
        match source {
            Source::CfsQuota => self.quota_us = None,
            Source::CfsPeriod => self.period_us = None,
            _ => {}
        }
    }
}

/// Parses a decimal `u64`, naming the word in the error.
pub(super) fn number(path: &Path, line: usize, word: &str) -> Result<u64, ParseError> {
    word.parse()
        .map_err(|_| error(path, line, format!("{word:?} is not a number")))
}

/// Parses a file of `key value` lines, each key of `fills` filling its field.
pub(super) fn keyed(
    text: &str,
    path: &Path,
    fills: &[(&str, Fill)],
    row: &mut Row,
    hz: f64,
) -> Result<(), ParseError> {
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_ascii_whitespace();
        let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
            return Err(error(path, n + 1, format!("{line:?} is not \"key value\"")));
        };
        if let Some((_, fill)) = fills.iter().find(|(k, _)| *k == key) {
            let value = number(path, n + 1, value)?;
            fill.set(&mut row.values, value, hz);
        }
    }
    Ok(())
}

/// The single word of a one-value file.
pub(super) fn single<'a>(text: &'a str, path: &Path) -> Result<&'a str, ParseError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let (Some(line), None) = (lines.next(), lines.next()) else {
        return Err(error(path, 1, "expected one line"));
    };
    let mut words = line.split_ascii_whitespace();
    match (words.next(), words.next()) {
        (Some(word), None) => Ok(word),
        _ => Err(error(path, 1, format!("{line:?} is not one value"))),
    }
}

/// Reads `total=` of the `some` and `full` lines of a pressure file, in
/// microseconds, into the fields `fills` names for them.
pub(super) fn pressure(
    text: &str,
    path: &Path,
    fills: &[(&str, Fill)],
    row: &mut Row,
    hz: f64,
) -> Result<(), ParseError> {
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split_ascii_whitespace();
        let Some(kind) = words.next() else {
            continue;
        };
        let Some((_, fill)) = fills.iter().find(|(k, _)| *k == kind) else {
            return Err(error(path, n + 1, format!("unknown line kind {kind:?}")));
        };
        let Some(total) = words.find_map(|w| w.strip_prefix("total=")) else {
            return Err(error(path, n + 1, "no total="));
        };
        let micros = number(path, n + 1, total)?;
        fill.set(&mut row.values, micros, hz);
    }
    Ok(())
}

pub(super) const MICROS: f64 = 1e6;

pub(super) const NANOS: f64 = 1e9;

/// Memory limits at or above this are the kernel's "unlimited" (v1 writes
/// `PAGE_COUNTER_MAX` pages: 9223372036854771712 with 4 KiB pages).
pub(super) const UNLIMITED_BYTES: u64 = 1 << 62;

/// Parses one file's text into `row`.
pub(super) fn parse(
    source: Source,
    text: &str,
    path: &Path,
    row: &mut Row,
    hz: f64,
) -> Result<(), ParseError> {
    let fills = source.fills();
    // A one-value file's number, into its field.
    let one = |row: &mut Row, n: u64| {
        for (_, fill) in fills {
            fill.set(&mut row.values, n, hz);
        }
    };
    match source {
        Source::CpuStatV2
        | Source::CpuStatV1
        | Source::CpuacctStat
        | Source::MemoryStatV2
        | Source::MemoryStatV1
        | Source::MemoryEvents
        | Source::OomControl => keyed(text, path, fills, row, hz),
        Source::CpuacctUsage
        | Source::MemoryCurrent
        | Source::MemoryUsage
        | Source::SwapCurrent
        | Source::KmemUsage => {
            one(row, number(path, 1, single(text, path)?)?);
            Ok(())
        }
        Source::CpuMax => {
            let mut lines = text.lines();
            let line = lines.next().unwrap_or("");
            let mut words = line.split_ascii_whitespace();
            let (Some(quota), Some(period), None) = (words.next(), words.next(), words.next())
            else {
                return Err(error(path, 1, format!("{line:?} is not \"quota period\"")));
            };
            let period = number(path, 1, period)?;
            if quota != "max" {
                let quota = number(path, 1, quota)?;
                if period == 0 {
                    return Err(error(path, 1, "period 0"));
                }
                row.values.cpu_quota_cpus = Some(quota as f64 / period as f64);
            }
            Ok(())
        }
        Source::CfsQuota => {
            let word = single(text, path)?;
            let quota: i64 = word
                .parse()
                .map_err(|_| error(path, 1, format!("{word:?} is not a number")))?;
            row.quota_us = Some(quota);
            Ok(())
        }
        Source::CfsPeriod => {
            row.period_us = Some(number(path, 1, single(text, path)?)?);
            Ok(())
        }
        Source::MemoryMax => {
            let word = single(text, path)?;
            if word != "max" {
                one(row, number(path, 1, word)?);
            }
            Ok(())
        }
        Source::MemoryLimit => {
            let v = number(path, 1, single(text, path)?)?;
            if v < UNLIMITED_BYTES {
                one(row, v);
            }
            Ok(())
        }
        Source::CpuPressure | Source::MemoryPressure | Source::IoPressure => {
            pressure(text, path, fills, row, hz)
        }
        Source::IoStat => per_device(text, path, fills, row),
    }
}

/// Sums the per-device byte counts of `io.stat` (`8:0 rbytes=N wbytes=N
/// ...`) into the fields `fills` names. A cgroup that did no I/O yet lists
/// no device: zero. Keys a kernel adds (io.cost's `cost.*`) are skipped.
fn per_device(
    text: &str,
    path: &Path,
    fills: &[(&str, Fill)],
    row: &mut Row,
) -> Result<(), ParseError> {
    let mut sums = vec![0u64; fills.len()];
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split_ascii_whitespace();
        let Some(device) = words.next() else {
            continue;
        };
        if !device.contains(':') {
            return Err(error(path, n + 1, format!("{device:?} is not a MAJ:MIN device")));
        }
        for (key, value) in words.filter_map(|w| w.split_once('=')) {
            if let Some(i) = fills.iter().position(|(k, _)| *k == key) {
                let value = number(path, n + 1, value)?;
                sums[i] = sums[i]
                    .checked_add(value)
                    .ok_or_else(|| error(path, n + 1, format!("{key} overflows 64 bits summed")))?;
            }
        }
    }
    for ((_, fill), sum) in fills.iter().zip(sums) {
        fill.set(&mut row.values, sum, 1.0);
    }
    Ok(())
}
