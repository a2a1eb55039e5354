//! Reading a port: its counters, state and rate, the text of each file,
//! and the problems an operator should hear of.

use super::*;

/// How a read went.
pub(super) enum ReadOutcome<'a> {
    /// The file's text (in the reused buffer).
    Read(&'a str),
    /// The file is not there (`ENOENT`, or `ENODEV` for a removed device).
    Missing,
    /// The driver refused the read (`EINVAL`, `EIO`, ...).
    Refused(io::Error),
}

pub(super) fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Sorts `mlx5_2` before `mlx5_10`.
pub(super) fn natural_key(name: &str) -> (&str, u64, &str) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, number) = name.split_at(name.len() - digits);
    (stem, number.parse().unwrap_or(0), name)
}

/// Gb/s with at most the decimals needed ("400", "2.5", "14.0625").
pub(super) fn format_gbits(bits: u64) -> String {
    let whole = bits / 1_000_000_000;
    let frac = bits % 1_000_000_000;
    if frac == 0 {
        whole.to_string()
    } else {
        let frac = format!("{frac:09}");
        format!("{whole}.{}", frac.trim_end_matches('0'))
    }
}

/// `path` holds what the kernel never writes there.
pub(super) fn bad(path: &Path, reason: impl Into<String>) -> ParseError {
    ParseError {
        path: path.display().to_string(),
        line: 0,
        reason: reason.into(),
    }
}

/// Reads a kept file into `buf` (one `pread` once it is open).
pub(super) fn read_kept<'b>(file: &mut KeptFile, buf: &'b mut Vec<u8>) -> Result<ReadOutcome<'b>, ParseError> {
    match file.read(buf) {
        Ok(len) if len >= READ_LIMIT => {
            // Give back what the oversized file made the buffer grow to.
            *buf = Vec::new();
            Err(bad(
                file.path(),
                format!("longer than {READ_LIMIT} bytes: not a sysfs attribute"),
            ))
        }
        Ok(len) => match std::str::from_utf8(&buf[..len]) {
            Ok(text) => Ok(ReadOutcome::Read(text)),
            Err(_) => Err(bad(file.path(), "not UTF-8 text")),
        },
        Err(e) if super::super::kept::is_gone(&e) => Ok(ReadOutcome::Missing),
        Err(e) => Ok(ReadOutcome::Refused(e)),
    }
}

/// Reads `path` once (open, `pread`, close): for what the walk reads.
pub(super) fn read_path<'b>(path: &Path, buf: &'b mut Vec<u8>) -> Result<ReadOutcome<'b>, ParseError> {
    read_kept(&mut KeptFile::new(path.to_owned()), buf)
}

/// A device-level text attribute read at walk time; empty when absent, or
/// when it reads badly (then named in `errors`).
pub(super) fn read_text(path: &Path, buf: &mut Vec<u8>, errors: &mut Vec<ParseError>) -> String {
    match read_path(path, buf) {
        Ok(ReadOutcome::Read(text)) => text.trim().to_owned(),
        Ok(ReadOutcome::Missing | ReadOutcome::Refused(_)) => String::new(),
        Err(e) => {
            errors.push(e);
            String::new()
        }
    }
}

/// The text attributes of a port read this tick (the rest is in [`Port`]).
pub(super) struct Link {
    pub(super) state: &'static str,
    pub(super) phys_state: &'static str,
    pub(super) rate: Option<u64>,
}

/// Reads one file of a port: `Some(Some(text))`, `Some(None)` when absent,
/// refused or read badly (a null; a bad read is named in `errors`), `None`
/// when the port is gone.
pub(super) fn read_port_file<'b>(
    file: &mut KeptFile,
    port_dir: &Path,
    buf: &'b mut Vec<u8>,
    problems: &mut Vec<String>,
    errors: &mut Vec<ParseError>,
    stale: &mut bool,
) -> Option<Option<&'b str>> {
    match read_kept(file, buf) {
        Ok(ReadOutcome::Read(text)) => Some(Some(text)),
        Ok(ReadOutcome::Missing) => {
            *stale = true;
            if port_dir.exists() {
                Some(None)
            } else {
                None
            }
        }
        Ok(ReadOutcome::Refused(e)) => {
            problems.push(format!("{}: {e}", file.path().display()));
            Some(None)
        }
        Err(e) => {
            errors.push(e);
            Some(None)
        }
    }
}

/// Reads a port's attributes and counters into `values` (its tags left
/// empty); `None` if it
/// vanished. A file that reads badly leaves its value null (its tag empty)
/// and is named in `errors`.
pub(super) fn read_port(
    port: &mut Port,
    buf: &mut Vec<u8>,
    values: &mut PortRow<'_>,
    problems: &mut Vec<String>,
    errors: &mut Vec<ParseError>,
    stale: &mut bool,
) -> Option<Link> {
    let mut link = Link {
        state: "",
        phys_state: "",
        rate: None,
    };
    macro_rules! read {
        ($file:expr) => {
            match read_port_file($file, &port.dir, buf, problems, errors, stale) {
                None => return None,
                Some(text) => text,
            }
        };
    }
    // What reads badly costs its own value only.
    macro_rules! parsed {
        ($result:expr, $file:expr) => {
            match $result {
                Ok(v) => Some(v),
                Err(reason) => {
                    errors.push(bad($file.path(), reason));
                    None
                }
            }
        };
    }
    if let Some(text) = read!(&mut port.state) {
        if let Some((n, name)) = parsed!(parse_state(text, STATES, 0), port.state) {
            values.state = Some(n);
            link.state = name;
        }
    }
    if let Some(text) = read!(&mut port.phys_state) {
        if let Some((n, name)) = parsed!(parse_state(text, PHYS_STATES, 1), port.phys_state) {
            values.phys_state = Some(n);
            link.phys_state = name;
        }
    }
    if let Some(text) = read!(&mut port.rate) {
        if let Some(bits) = parsed!(parse_rate(text), port.rate) {
            values.rate_bytes_per_second = Some(bits as f64 / 8.0);
            link.rate = Some(bits);
            let text = text.trim_end();
            if port.rate_text != text {
                port.rate_text.clear();
                port.rate_text.push_str(text);
            }
        }
    }
    if let Some(problem) = &port.lid_problem {
        problems.push(problem.clone());
    }
    for counter in &mut port.counters {
        // Once taken, the wider set stays the source while it reads.
        if counter.on_fallback {
            if let Some(fallback) = counter.fallback.as_mut() {
                let wider = match read!(fallback) {
                    Some(text) => parsed!(parse_counter(text), fallback).flatten(),
                    None => None,
                };
                if let Some(m) = wider {
                    if let Some(scaled) = parsed!(scaled(m, counter.factor), fallback) {
                        *(counter.field)(values) = Some(scaled);
                    }
                } else {
                    // The 32-bit count in its place would read as a reset,
                    // and the wider one's return as all its count again.
                    problems.push(format!(
                        "{}: does not read: no count (the counter's source since {} stopped at 2^32-1)",
                        fallback.path().display(),
                        counter.file.path().display()
                    ));
                }
                continue;
            }
        }
        let Some(text) = read!(&mut counter.file) else {
            continue;
        };
        let Some(Some(mut n)) = parsed!(parse_counter(text), counter.file) else {
            continue;
        };
        let mut source = &counter.file;
        if n == SATURATED_32_BITS {
            match &mut counter.fallback {
                Some(fallback) => {
                    let wider = match read!(fallback) {
                        Some(text) => parsed!(parse_counter(text), fallback).flatten(),
                        None => None,
                    };
                    match wider {
                        Some(m) if m >= n => {
                            n = m;
                            source = &*fallback;
                            counter.on_fallback = true;
                        }
                        Some(m) => problems.push(format!(
                            "{}: stuck at 2^32-1, and {} reads {m}, less: neither counts",
                            counter.file.path().display(),
                            fallback.path().display()
                        )),
                        // The wider count is due and not there this tick:
                        // the stopped 32-bit one now, then the wider one,
                        // would read as billions counted in one tick.
                        None => {
                            problems.push(format!(
                                "{}: stuck at 2^32-1, and {} does not read: no count",
                                counter.file.path().display(),
                                fallback.path().display()
                            ));
                            continue;
                        }
                    }
                }
                None if counter.factor == 4 => problems.push(format!(
                    "{}: stuck at 2^32-1 (a 32-bit counter that saturated; this kernel or driver lacks the 64-bit extended counters)",
                    counter.file.path().display()
                )),
                None => {}
            }
        }
        if let Some(scaled) = parsed!(scaled(n, counter.factor), source) {
            *(counter.field)(values) = Some(scaled);
        }
    }
    Some(link)
}

/// A PMA count in bytes or packets: times 4 for the data counters' words.
fn scaled(n: u64, factor: u64) -> Result<u64, String> {
    n.checked_mul(factor)
        .ok_or_else(|| format!("{n} times {factor} overflows 64 bits"))
}

/// Reads hw_counters into `values`; `false` if their owner vanished. A
/// counter that reads badly is a null, named in `errors`.
pub(super) fn read_hw(
    counters: &mut [HwCounter],
    owner: &Path,
    buf: &mut Vec<u8>,
    values: &mut Vec<Option<u64>>,
    problems: &mut Vec<String>,
    errors: &mut Vec<ParseError>,
    stale: &mut bool,
) -> bool {
    for hw in counters {
        let value = match read_port_file(&mut hw.file, owner, buf, problems, errors, stale) {
            None => return false,
            Some(None) => None,
            Some(Some(text)) => match parse_counter(text) {
                Ok(n) => n,
                Err(reason) => {
                    errors.push(bad(hw.file.path(), reason));
                    None
                }
            },
        };
        values.push(value);
    }
    true
}

/// Parses a counter file: a decimal `u64` and a newline; `None` for the
/// kernel's "N/A (no PMA)".
pub(super) fn parse_counter(text: &str) -> Result<Option<u64>, String> {
    let t = text.strip_suffix('\n').unwrap_or(text);
    if t == NO_PMA {
        return Ok(None);
    }
    if t.is_empty() {
        return Err("empty".into());
    }
    if !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{t:?} is not a counter"));
    }
    t.parse::<u64>()
        .map(Some)
        .map_err(|_| format!("{t:?} overflows 64 bits"))
}

/// Parses `"4: ACTIVE"`: the number and the kernel's name for it, which must
/// agree (`first` is the number of `names[0]`). The kernel writes UNKNOWN or
/// `<unknown>` for numbers it has no name for.
pub(super) fn parse_state(
    text: &str,
    names: &[&'static str],
    first: u64,
) -> Result<(u64, &'static str), String> {
    let t = text.strip_suffix('\n').unwrap_or(text);
    let bad = || format!("{t:?} is not a port state");
    let (number, name) = t.split_once(": ").ok_or_else(bad)?;
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = number.parse().map_err(|_| bad())?;
    let known = n
        .checked_sub(first)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| names.get(i));
    match known {
        Some(&expected) if expected == name => Ok((n, expected)),
        None if name == "UNKNOWN" => Ok((n, "UNKNOWN")),
        None if name == "<unknown>" => Ok((n, "<unknown>")),
        _ => Err(bad()),
    }
}

/// Parses the kernel's `rate` text ("400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)")
/// into bits per second.
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let t = text.strip_suffix('\n').unwrap_or(text);
    let bad = || format!("{t:?} is not a rate in Gb/sec");
    let (number, rest) = t.split_once(' ').ok_or_else(bad)?;
    let rest = rest.strip_prefix("Gb/sec").ok_or_else(bad)?;
    if !(rest.is_empty() || (rest.starts_with(" (") && rest.ends_with(')'))) {
        return Err(bad());
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(frac) || frac.len() > 9 {
        return Err(bad());
    }
    if number.ends_with('.') {
        return Err(bad());
    }
    let whole: u64 = whole.parse().map_err(|_| bad())?;
    let frac_bits: u64 = if frac.is_empty() {
        0
    } else {
        let scale = 10u64.pow(9 - frac.len() as u32);
        frac.parse::<u64>().map_err(|_| bad())? * scale
    };
    whole
        .checked_mul(1_000_000_000)
        .and_then(|b| b.checked_add(frac_bits))
        .ok_or_else(bad)
}

/// What `vtax doctor` should hear about a port.
pub(super) fn port_problems(link: &Link, row: &PortRow, port: &Port, problems: &mut Vec<String>) {
    let label = &port.label;
    let (state, phys) = (row.state, row.phys_state);
    if state.is_some_and(|s| s != ACTIVE) || phys.is_some_and(|p| p != LINK_UP) {
        let why = match (phys, port.link_layer.as_str()) {
            (Some(2), _) => "no link: check the cable, transceiver and the peer's port",
            // mlx5 reports a RoCE port Disabled whenever its netdev is down
            // or has no carrier: a pulled cable reads the same.
            (Some(3), "Ethernet") => {
                "its Ethernet interface is down or has no carrier (RoCE says Disabled for both): \
                 check `ip link`, the cable and the switch port"
            }
            (Some(3), _) => "the port is disabled",
            (Some(LINK_UP), "InfiniBand") => {
                "the link is up but the subnet manager has not activated the port"
            }
            _ => "the port cannot carry traffic",
        };
        problems.push(format!(
            "{label} is {}/{}: {why}",
            link.state, link.phys_state
        ));
    }
    if let Some(n) = row.link_downed.filter(|&n| n > 0) {
        problems.push(format!(
            "{label}: link_downed = {n}: the link went down since its counters were last cleared"
        ));
    }
    let errors: Vec<String> = [
        (row.symbol_error, "symbol_error"),
        (row.link_error_recovery, "link_error_recovery"),
    ]
    .iter()
    .filter_map(|&(n, name)| n.filter(|&n| n > 0).map(|n| format!("{name} = {n}")))
    .collect();
    if !errors.is_empty() {
        problems.push(format!(
            "{label}: physical errors since the counters were last cleared ({}): check the cable and transceiver",
            errors.join(", ")
        ));
    }
}
