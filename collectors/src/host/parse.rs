//! Reading and parsing the host's files: /proc/stat, loadavg, meminfo,
//! pressure and schedstat, each failure naming its file and line.

use super::*;

/// PSI resources, in the order their rows are written.
pub(super) const PRESSURE_RESOURCES: [&str; 4] = ["cpu", "memory", "io", "irq"];

/// The oldest `/proc/schedstat` version whose cpu lines are read (15: Linux
/// 4.x; 16 and 17 changed only the domain lines).
pub(super) const SCHEDSTAT_MIN_VERSION: u32 = 15;

pub(crate) fn fail(path: &str, line: usize, reason: impl Into<String>) -> ParseError {
    ParseError {
        path: path.to_string(),
        line,
        reason: reason.into(),
    }
}

/// Parses an unsigned decimal, saying what it should have been.
pub(crate) fn parse_u64(word: &str, what: &str) -> Result<u64, String> {
    word.parse::<u64>().map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => format!("{word:?} overflows a 64-bit {what}"),
        _ => format!("{word:?} is not a {what}"),
    })
}

/// Parses a finite, non-negative decimal (load averages, PSI averages).
pub(super) fn parse_f64(word: &str, what: &str) -> Result<f64, String> {
    match word.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("{word:?} is not a {what}")),
    }
}

/// One read of every host source.
#[derive(Debug)]
pub struct Sample {
    /// Rows, one batch per table that has any.
    pub batches: Vec<Batch>,
    /// What an operator should know (optional sources missing).
    pub problems: Vec<String>,
    /// Files that read badly, one error each: their rows are left out.
    pub errors: Vec<ParseError>,
    pub(super) cpus: usize,
    pub(super) pressure: Vec<&'static str>,
    pub(super) schedstat: Schedstat,
}

/// What `/proc/schedstat` held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Schedstat {
    Absent,
    Unsupported(u32),
    Read(u32),
}

impl Sample {
    /// One line for `vtax doctor`, e.g. "2 CPUs; pressure: cpu memory io; schedstat v15".
    pub fn summary(&self) -> String {
        let pressure = if self.pressure.is_empty() {
            "none".to_string()
        } else {
            self.pressure.join(" ")
        };
        let schedstat = match self.schedstat {
            Schedstat::Absent => "schedstat: none".to_string(),
            Schedstat::Unsupported(v) => format!("schedstat: v{v} unsupported"),
            Schedstat::Read(v) => format!("schedstat v{v}"),
        };
        format!("{} CPUs; pressure: {pressure}; {schedstat}", self.cpus)
    }
}

/// Reads a required file.
pub(super) fn read(path: &Path) -> Result<String, ParseError> {
    std::fs::read_to_string(path).map_err(|e| fail(&path.display().to_string(), 0, e.to_string()))
}

/// Reads an optional file: `None` where the kernel lacks it (or refuses it as
/// unsupported); a file we may not read is also `None`, with a problem noted.
pub(super) fn read_optional(path: &Path, problems: &mut Vec<String>) -> Result<Option<String>, ParseError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            problems.push(format!("{}: {e}", path.display()));
            Ok(None)
        }
        Err(e) => Err(fail(&path.display().to_string(), 0, e.to_string())),
    }
}

/// Reads every host source under `roots` once, stamping rows with `time_us`;
/// `hz` is the kernel's `USER_HZ`. Each file is read on its own: one that
/// reads badly is in [`Sample::errors`] and costs only its own rows (for
/// `/proc/stat`, the CPU lines and the kernel lines each). Fails only when
/// no file gave a row, with the first error.
pub fn sample(roots: &Roots, time_us: i64, hz: f64) -> Result<Sample, ParseError> {
    let mut batches = Vec::new();
    let mut problems = Vec::new();
    let mut errors = Vec::new();
    // One error per file: the source the runtime counts and logs.
    fn failed(error: ParseError, errors: &mut Vec<ParseError>) {
        if !errors.iter().any(|e| e.path == error.path) {
            errors.push(error);
        }
    }

    let path = roots.proc("stat");
    let shown = path.display().to_string();
    let mut cpus = 0;
    match read(&path) {
        Ok(text) => {
            match parse(&text, &shown, time_us, hz) {
                Ok((cpu, skipped)) => {
                    cpus = cpu.len();
                    batches.push(cpu);
                    skipped.into_iter().for_each(|e| failed(e, &mut errors));
                }
                Err(e) => failed(e, &mut errors),
            }
            match parse_kernel(&text, &shown, time_us) {
                Ok(kernel) => batches.push(kernel),
                Err(e) => failed(e, &mut errors),
            }
        }
        Err(e) => failed(e, &mut errors),
    }

    let path = roots.proc("loadavg");
    match read(&path).and_then(|text| parse_loadavg(&text, &path.display().to_string(), time_us)) {
        Ok(load) => batches.push(load),
        Err(e) => failed(e, &mut errors),
    }

    let path = roots.proc("meminfo");
    match read(&path).and_then(|text| parse_meminfo(&text, &path.display().to_string(), time_us)) {
        Ok((memory, skipped)) => {
            batches.push(memory);
            skipped.into_iter().for_each(|e| failed(e, &mut errors));
        }
        Err(e) => failed(e, &mut errors),
    }

    // A file we may not read is noted as such, not as a kernel without it.
    let denied_before = problems.len();
    let errors_before = errors.len();
    let mut pressure = Vec::new();
    let mut builder = BatchBuilder::new(&PRESSURE);
    for resource in PRESSURE_RESOURCES {
        let path = roots.proc("pressure").join(resource);
        let shown = path.display().to_string();
        let row = match read_optional(&path, &mut problems) {
            Ok(None) => continue,
            Ok(Some(text)) => parse_pressure(&text, &shown, resource),
            Err(e) => Err(e),
        };
        let pushed = row.and_then(|row| {
            builder
                .push_row(time_us, &row)
                .map_err(|e| fail(&shown, 0, e.to_string()))
        });
        match pushed {
            Ok(()) => pressure.push(resource),
            Err(e) => failed(e, &mut errors),
        }
    }
    if pressure.is_empty() && problems.len() == denied_before && errors.len() == errors_before {
        problems.push(format!(
            "no {}: kernel built without PSI (CONFIG_PSI) or booted with psi=0; no pressure rows",
            roots.proc("pressure").display()
        ));
    } else if !pressure.is_empty() {
        batches.push(builder.finish());
    }

    let path = roots.proc("schedstat");
    let shown = path.display().to_string();
    let denied_before = problems.len();
    let read_schedstat = read_optional(&path, &mut problems).and_then(|text| match text {
        None => Ok(None),
        Some(text) => parse_schedstat(&text, &shown, time_us).map(Some),
    });
    let schedstat = match read_schedstat {
        Err(e) => {
            failed(e, &mut errors);
            Schedstat::Absent
        }
        Ok(None) => {
            if problems.len() == denied_before {
                problems.push(format!(
                    "no {shown}: kernel built without CONFIG_SCHEDSTATS; no per-CPU run delay (cpu_sched rows)"
                ));
            }
            Schedstat::Absent
        }
        Ok(Some((schedstat, batch, skipped))) => {
            skipped.into_iter().for_each(|e| failed(e, &mut errors));
            if let Schedstat::Unsupported(v) = schedstat {
                problems.push(format!(
                    "{shown} is version {v}; only {SCHEDSTAT_MIN_VERSION} and later are read: no cpu_sched rows"
                ));
            }
            batches.extend(batch);
            schedstat
        }
    };

    if batches.is_empty() && !errors.is_empty() {
        return Err(errors.swap_remove(0));
    }
    Ok(Sample {
        batches,
        problems,
        errors,
        cpus,
        pressure,
        schedstat,
    })
}

/// The per-CPU lines of `/proc/stat` (not the all-CPU total): the 0-based
/// line number, the CPU number's text and the words after it.
pub(crate) fn per_cpu_lines(
    text: &str,
) -> impl Iterator<Item = (usize, &str, std::str::SplitAsciiWhitespace<'_>)> {
    text.lines().enumerate().filter_map(|(n, line)| {
        let mut words = line.split_ascii_whitespace();
        let cpu = words.next()?.strip_prefix("cpu")?;
        (!cpu.is_empty()).then_some((n, cpu, words))
    })
}

/// Rows of one per-CPU file, and the lines it skipped.
type PerCpu = (Batch, Vec<ParseError>);

/// Ends a per-CPU parse: one line that reads badly costs its own CPU's row
/// (a driver's or a new kernel's odd line), not the other CPUs'. Fails only
/// when no line gave a row, with the first bad line's error or `none`.
fn per_cpu_rows(
    mut builder: BatchBuilder,
    mut skipped: Vec<ParseError>,
    none: ParseError,
) -> Result<PerCpu, ParseError> {
    if builder.is_empty() {
        return Err(if skipped.is_empty() {
            none
        } else {
            skipped.swap_remove(0)
        });
    }
    Ok((builder.finish(), skipped))
}

/// Parses the per-CPU lines of `/proc/stat` into one row per CPU.
pub(super) fn parse(text: &str, path: &str, time_us: i64, hz: f64) -> Result<PerCpu, ParseError> {
    let mut builder = BatchBuilder::new(&CPU);
    let mut skipped = Vec::new();
    for (n, cpu, words) in per_cpu_lines(text) {
        let row = match cpu_row(cpu, words, hz) {
            Ok(row) => row,
            Err(reason) => {
                skipped.push(fail(path, n + 1, reason));
                continue;
            }
        };
        builder
            .push_row(time_us, &row)
            .map_err(|e| fail(path, n + 1, e.to_string()))?;
    }
    per_cpu_rows(builder, skipped, fail(path, 0, "no per-CPU lines"))
}

/// One `cpuN` line's row, its tick counts in seconds.
fn cpu_row<'a>(
    cpu: &'a str,
    words: std::str::SplitAsciiWhitespace<'_>,
    hz: f64,
) -> Result<CpuRow<'a>, String> {
    if cpu.parse::<u32>().is_err() {
        return Err(format!("bad CPU number {cpu:?}"));
    }
    // The kernel's columns, in its order; older kernels end the line early.
    let mut columns = [None; 8];
    for (slot, word) in columns.iter_mut().zip(words) {
        *slot = Some(parse_u64(word, "tick count")? as f64 / hz);
    }
    let [user, nice, system, idle, iowait, irq, softirq, steal] = columns;
    let (Some(user), Some(nice), Some(system), Some(idle)) = (user, nice, system, idle) else {
        return Err("fewer than 4 columns".into());
    };
    Ok(CpuRow {
        cpu,
        user_seconds: user,
        nice_seconds: nice,
        system_seconds: system,
        idle_seconds: idle,
        iowait_seconds: iowait,
        irq_seconds: irq,
        softirq_seconds: softirq,
        steal_seconds: steal,
    })
}

/// Parses the kernel activity lines of `/proc/stat` into one row.
pub(super) fn parse_kernel(text: &str, path: &str, time_us: i64) -> Result<Batch, ParseError> {
    let mut row = KernelRow::default();
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split_ascii_whitespace();
        let Some(key) = words.next() else {
            continue;
        };
        let Some((_, _, field)) = STAT_KEYS.iter().find(|(k, _, _)| *k == key) else {
            continue;
        };
        // `intr` and `softirq` lead with the total, then one count per source.
        let word = words
            .next()
            .ok_or_else(|| fail(path, n + 1, format!("{key} has no value")))?;
        let value = parse_u64(word, "count").map_err(|e| fail(path, n + 1, e))?;
        *field(&mut row) = Some(value);
    }
    for (key, required, field) in STAT_KEYS {
        if *required && field(&mut row).is_none() {
            return Err(fail(path, 0, format!("no {key} line")));
        }
    }
    let mut builder = BatchBuilder::new(&KERNEL);
    builder
        .push_row(time_us, &row)
        .map_err(|e| fail(path, 0, e.to_string()))?;
    Ok(builder.finish())
}

/// Parses `/proc/loadavg`: `load1 load5 load15 runnable/total last_pid`.
pub(super) fn parse_loadavg(text: &str, path: &str, time_us: i64) -> Result<Batch, ParseError> {
    let line = text.lines().next().unwrap_or("");
    let fail = |reason: String| fail(path, 1, reason);
    let mut words = line.split_ascii_whitespace();
    let mut next = |what: &str| {
        words
            .next()
            .ok_or_else(|| fail(format!("truncated: no {what}")))
    };
    let mut load = |what: &str| -> Result<f64, ParseError> {
        parse_f64(next(what)?, "load average").map_err(fail)
    };
    let (load1, load5, load15) = (load("load1")?, load("load5")?, load("load15")?);
    let tasks = next("runnable/total tasks")?;
    let (runnable, total) = tasks
        .split_once('/')
        .ok_or_else(|| fail(format!("{tasks:?} is not runnable/total")))?;
    let row = LoadRow {
        load1,
        load5,
        load15,
        runnable_tasks: parse_u64(runnable, "task count").map_err(fail)?,
        tasks: parse_u64(total, "task count").map_err(fail)?,
    };
    let mut builder = BatchBuilder::new(&LOAD);
    builder
        .push_row(time_us, &row)
        .map_err(|e| fail(e.to_string()))?;
    Ok(builder.finish())
}

/// Parses `/proc/meminfo`: `Key:   <n> kB` lines, or a bare count for huge pages.
pub(super) fn parse_meminfo(
    text: &str,
    path: &str,
    time_us: i64,
) -> Result<(Batch, Vec<ParseError>), ParseError> {
    let mut row = MemoryRow::default();
    let mut skipped = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, rest)) = line.split_once(':') else {
            skipped.push(fail(path, n + 1, format!("{line:?} is not 'Key: value'")));
            continue;
        };
        // Only the lines stored are read: a kernel's new line, or an odd
        // value in one vtax does not keep, costs nothing.
        let Some((_, want, field)) = MEMINFO.iter().find(|(k, _, _)| *k == key) else {
            continue;
        };
        // One that does not read costs its own field, not the row.
        match meminfo_value(key, rest, *want) {
            Ok(value) => *field(&mut row) = Some(value),
            Err(reason) => skipped.push(fail(path, n + 1, reason)),
        }
    }
    for (key, _, field) in MEMINFO {
        if MEMINFO_REQUIRED.contains(key) && field(&mut row).is_none() {
            // A required line that did not read says why; so does a line
            // that did not read at all (a truncated file's last).
            let own = skipped
                .iter()
                .position(|e| e.reason.starts_with(&format!("{key}:")));
            return Err(match own.or((!skipped.is_empty()).then_some(0)) {
                Some(at) => skipped.swap_remove(at),
                None => fail(path, 0, format!("no {key} line")),
            });
        }
    }
    let mut builder = BatchBuilder::new(&MEMORY);
    builder
        .push_row(time_us, &row)
        .map_err(|e| fail(path, 0, e.to_string()))?;
    Ok((builder.finish(), skipped))
}

/// The value of a `/proc/meminfo` line after its `Key:`, in bytes for a `kB`
/// line (`want`), as a count for the unitless ones (`HugePages_Total`).
fn meminfo_value(key: &str, rest: &str, want: MemUnit) -> Result<u64, String> {
    let mut words = rest.split_ascii_whitespace();
    let word = words.next().ok_or_else(|| format!("{key}: no value"))?;
    let number = parse_u64(word, "number").map_err(|e| format!("{key}: {e}"))?;
    let value = match (words.next(), want) {
        (None, MemUnit::Count) => number,
        (Some("kB"), MemUnit::KiB) => number
            .checked_mul(1024)
            .ok_or_else(|| format!("{key}: {number} kB overflows 64 bits in bytes"))?,
        (None, MemUnit::KiB) => return Err(format!("{key}: no kB unit after the value")),
        (Some("kB"), MemUnit::Count) => return Err(format!("{key}: a count, not kB")),
        (Some(other), _) => return Err(format!("{key}: unknown unit {other:?}")),
    };
    if let Some(extra) = words.next() {
        return Err(format!("{key}: unexpected {extra:?} after the value"));
    }
    Ok(value)
}

/// Parses one `/proc/pressure/<resource>` file into a [`PRESSURE`] row:
/// `some avg10=0.00 avg60=0.00 avg300=0.00 total=0` (total in microseconds),
/// then the same for `full` (irq has only `full`; cpu before Linux 5.13 only `some`).
pub(super) fn parse_pressure<'a>(
    text: &str,
    path: &str,
    resource: &'a str,
) -> Result<PressureRow<'a>, ParseError> {
    let mut row = PressureRow {
        resource,
        ..PressureRow::default()
    };
    let mut lines = 0;
    for (n, line) in text.lines().enumerate() {
        let fail = |reason: String| fail(path, n + 1, reason);
        let mut words = line.split_ascii_whitespace();
        let Some(kind) = words.next() else {
            continue;
        };
        let (total_field, avg10_field) = match kind {
            "some" => (&mut row.some_stalled_seconds, &mut row.some_avg10_ratio),
            "full" => (&mut row.full_stalled_seconds, &mut row.full_avg10_ratio),
            _ => return Err(fail(format!("{kind:?} is neither some nor full"))),
        };
        let (mut avg10, mut total) = (None, None);
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| fail(format!("{word:?} is not key=value")))?;
            match key {
                "total" => {
                    let us = parse_u64(value, "microsecond count").map_err(fail)?;
                    total = Some(us as f64 / 1e6);
                }
                "avg10" => avg10 = Some(parse_f64(value, "percentage").map_err(fail)? / 100.0),
                _ => {
                    parse_f64(value, "percentage").map_err(fail)?;
                }
            }
        }
        let total = total.ok_or_else(|| fail(format!("{kind} line has no total=")))?;
        let avg10 = avg10.ok_or_else(|| fail(format!("{kind} line has no avg10=")))?;
        *total_field = Some(total);
        *avg10_field = Some(avg10);
        lines += 1;
    }
    if lines == 0 {
        return Err(fail(path, 0, "no some or full line"));
    }
    Ok(row)
}

/// Parses `/proc/schedstat`: a `version N` line, a `timestamp` line, then per
/// CPU a `cpuN` line of 9 counters followed by its `domainN` lines. Versions
/// before 15 are reported, not read.
pub(super) fn parse_schedstat(
    text: &str,
    path: &str,
    time_us: i64,
) -> Result<(Schedstat, Option<Batch>, Vec<ParseError>), ParseError> {
    let mut lines = text.lines().enumerate();
    let version = loop {
        let Some((n, line)) = lines.next() else {
            return Err(fail(path, 0, "no version line"));
        };
        let mut words = line.split_ascii_whitespace();
        match (words.next(), words.next(), words.next()) {
            (None, _, _) => continue,
            (Some("version"), Some(v), None) => {
                break parse_u64(v, "version")
                    .ok()
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| fail(path, n + 1, format!("{v:?} is not a version")))?;
            }
            _ => return Err(fail(path, n + 1, format!("{line:?} is not 'version N'"))),
        }
    };
    if version < SCHEDSTAT_MIN_VERSION {
        return Ok((Schedstat::Unsupported(version), None, Vec::new()));
    }
    let mut builder = BatchBuilder::new(&CPU_SCHED);
    let mut skipped = Vec::new();
    for (n, line) in lines {
        let mut words = line.split_ascii_whitespace();
        let Some(cpu) = words.next().and_then(|w| w.strip_prefix("cpu")) else {
            continue; // timestamp and domain lines
        };
        let row = match cpu_sched_row(cpu, words, version) {
            Ok(row) => row,
            Err(reason) => {
                skipped.push(fail(path, n + 1, reason));
                continue;
            }
        };
        builder
            .push_row(time_us, &row)
            .map_err(|e| fail(path, n + 1, e.to_string()))?;
    }
    let (batch, skipped) = per_cpu_rows(builder, skipped, fail(path, 0, "no cpu lines"))?;
    Ok((Schedstat::Read(version), Some(batch), skipped))
}

/// One `cpuN` line of `/proc/schedstat` version 15 or later.
fn cpu_sched_row<'a>(
    cpu: &'a str,
    mut words: std::str::SplitAsciiWhitespace<'_>,
    version: u32,
) -> Result<CpuSchedRow<'a>, String> {
    if cpu.parse::<u32>().is_err() {
        return Err(format!("bad CPU number {cpu:?}"));
    }
    let mut counters = [0u64; 9];
    let mut count = 0;
    for (slot, word) in counters.iter_mut().zip(words.by_ref()) {
        *slot = parse_u64(word, "counter")?;
        count += 1;
    }
    if count < counters.len() {
        return Err(format!(
            "{count} counters, version {version} has {}",
            counters.len()
        ));
    }
    for word in words {
        parse_u64(word, "counter")?;
    }
    let [_, _, _, _, _, _, running_ns, delay_ns, slices] = counters;
    Ok(CpuSchedRow {
        cpu,
        running_seconds: running_ns as f64 / 1e9,
        run_delay_seconds: delay_ns as f64 / 1e9,
        timeslices: slices,
    })
}
