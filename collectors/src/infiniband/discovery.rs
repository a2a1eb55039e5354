//! Finding the HCAs and their ports: the walk of the InfiniBand class
//! directory, each port's counter files, and when to walk again.

use super::*;

/// A driver-specific counter file.
#[derive(Debug)]
pub(super) struct HwCounter {
    pub(super) name: String,
    pub(super) file: KeptFile,
}

/// A PMA counter of [`PORT`] and the files chosen for it at the walk.
#[derive(Debug)]
pub(super) struct Counter {
    /// The field it fills.
    pub(super) field: CounterField,
    /// The first candidate of [`COUNTER_SOURCES`] that exists.
    pub(super) file: KeptFile,
    /// A later candidate (`counters_ext/`), read from the first time
    /// `file` is stuck at 2^32-1 on.
    pub(super) fallback: Option<KeptFile>,
    /// Whether `fallback` was taken: it then stays the source while it
    /// reads, since the two sets are cleared apart (`perfquery -R`, a fabric
    /// manager) and joining them would read one's count as the other's
    /// growth.
    pub(super) on_fallback: bool,
    /// To bytes (4 for the data counters, in 4-byte words) or packets (1).
    pub(super) factor: u64,
}

/// What a 32-bit PMA counter reads once it saturated.
pub(super) const SATURATED_32_BITS: u64 = u32::MAX as u64;

/// What `fstat` says of a port directory; any change means entries came or
/// went (on a regular filesystem, where a file deleted under an open
/// descriptor stays readable; sysfs answers ENODEV instead).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct DirStamp {
    pub(super) nlink: u64,
    pub(super) size: u64,
    pub(super) ctime: i64,
    pub(super) ctime_nsec: i64,
}

impl DirStamp {
    pub(super) fn of(meta: &std::fs::Metadata) -> Self {
        DirStamp {
            nlink: meta.nlink(),
            size: meta.size(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }
}

/// A port as the last walk found it.
#[derive(Debug)]
pub(super) struct Port {
    pub(super) num: String,
    /// `device/port`, for problems and `probe`.
    pub(super) label: String,
    pub(super) dir: PathBuf,
    /// The port directory held open, and how it looked at the walk: one
    /// `fstat` a tick tells whether the port (or part of it) went away.
    pub(super) dir_file: Option<(File, DirStamp)>,
    pub(super) state: KeptFile,
    pub(super) phys_state: KeptFile,
    pub(super) rate: KeptFile,
    /// The text of `rate` at the last read, kept to spare an allocation a tick.
    pub(super) rate_text: String,
    pub(super) link_layer: String,
    pub(super) lid: String,
    /// The problem the walk's read of `lid` had (the driver refused it),
    /// repeated every tick.
    pub(super) lid_problem: Option<String>,
    pub(super) counters: Vec<Counter>,
    pub(super) hw: Vec<HwCounter>,
}

impl Port {
    /// Whether the port directory is no longer as the walk found it (or its
    /// metadata cannot be read). One `fstat`. Where the walk could not open
    /// the directory, the kept `state` file says at least whether the port
    /// was deleted.
    pub(super) fn dir_changed(&self) -> bool {
        match &self.dir_file {
            Some((file, stamp)) => file.metadata().map_or(true, |m| DirStamp::of(&m) != *stamp),
            None => self.state.is_deleted(),
        }
    }

    /// Closes every kept file, so the next reads go through the paths again.
    pub(super) fn close_files(&mut self) {
        self.state.close();
        self.phys_state.close();
        self.rate.close();
        for counter in &mut self.counters {
            counter.file.close();
        }
        for hw in &mut self.hw {
            hw.file.close();
        }
    }
}

/// A device as the last walk found it.
#[derive(Debug)]
pub(super) struct Device {
    pub(super) name: String,
    pub(super) dir: PathBuf,
    pub(super) hca_type: String,
    pub(super) board_id: String,
    pub(super) fw_ver: String,
    pub(super) node_guid: String,
    pub(super) hw: Vec<HwCounter>,
    pub(super) ports: Vec<Port>,
}

/// What a port looked like at the last tick, for `probe`: indices into
/// `devices` and its `ports`.
#[derive(Debug)]
pub(super) struct PortSeen {
    pub(super) device: usize,
    pub(super) port: usize,
    pub(super) state: &'static str,
    pub(super) rate: Option<u64>,
}

/// Names of the regular files in `dir`, sorted; empty if there is no `dir`.
pub(super) fn list_files(dir: &Path) -> Result<Vec<String>, ParseError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(bad(dir, e.to_string())),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| bad(dir, e.to_string()))?;
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
    }
    names.sort();
    Ok(names)
}

/// Whether an `hw_counters/` file holds a counter. `lifespan` is a setting;
/// some drivers (bnxt_re) put current values beside their counters: live
/// object counts (`active_qps`), high-water marks (`watermark_*`) and a raw
/// register (`db_fifo_register`). Exported as counters, each fall of one
/// would read as a reset, and `rate()` would invent traffic.
pub(super) fn is_hw_counter(name: &str) -> bool {
    name != "lifespan"
        && !name.starts_with("active_")
        && !name.starts_with("watermark_")
        && !name.ends_with("_register")
}

/// The `hw_counters/` of a port or device; none, named in `errors`, when
/// the directory cannot be listed.
pub(super) fn walk_hw(dir: &Path, enabled: bool, errors: &mut Vec<ParseError>) -> Vec<HwCounter> {
    if !enabled {
        return Vec::new();
    }
    let dir = dir.join("hw_counters");
    let names = list_files(&dir).unwrap_or_else(|e| {
        errors.push(e);
        Vec::new()
    });
    names
        .into_iter()
        .filter(|name| is_hw_counter(name))
        .map(|name| HwCounter {
            file: KeptFile::new(dir.join(&name)),
            name,
        })
        .collect()
}

/// Walks one device; `None` if it vanished meanwhile or its ports cannot be
/// listed (then named in `errors`). A port's link layer or LID that reads
/// badly is left empty and named in `errors`; the port is read.
pub(super) fn walk_device(
    name: String,
    dir: PathBuf,
    hw_counters: bool,
    buf: &mut Vec<u8>,
    errors: &mut Vec<ParseError>,
) -> Option<Device> {
    let ports_dir = dir.join("ports");
    let entries = match std::fs::read_dir(&ports_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A device without ports/ is not an RDMA device we can read, or
            // it is going away.
            return None;
        }
        Err(e) => {
            errors.push(bad(&ports_dir, e.to_string()));
            return None;
        }
    };
    let mut numbers = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                errors.push(bad(&ports_dir, e.to_string()));
                return None;
            }
        };
        if let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    let mut ports = Vec::with_capacity(numbers.len());
    for n in numbers {
        let num = n.to_string();
        let pdir = ports_dir.join(&num);
        let link_layer_path = pdir.join("link_layer");
        let link_layer = match read_path(&link_layer_path, buf) {
            Ok(ReadOutcome::Read(text)) => {
                let text = text.trim_end_matches('\n');
                if matches!(text, "InfiniBand" | "Ethernet" | "Unknown") {
                    text.to_owned()
                } else {
                    errors.push(bad(
                        &link_layer_path,
                        format!("unknown link layer {text:?}"),
                    ));
                    String::new()
                }
            }
            Ok(ReadOutcome::Missing) if !pdir.exists() => continue,
            Ok(ReadOutcome::Missing | ReadOutcome::Refused(_)) => String::new(),
            Err(e) => {
                errors.push(e);
                String::new()
            }
        };
        let lid_path = pdir.join("lid");
        let mut lid_problem = None;
        let lid = match read_path(&lid_path, buf) {
            Ok(ReadOutcome::Read(text)) => {
                let text = text.trim_end();
                let ok = text.strip_prefix("0x").is_some_and(|hex| {
                    u32::from_str_radix(hex, 16).is_ok() && !hex.starts_with('+')
                });
                if ok {
                    text.to_owned()
                } else {
                    errors.push(bad(&lid_path, format!("{text:?} is not a hex LID")));
                    String::new()
                }
            }
            Ok(ReadOutcome::Missing) if !pdir.exists() => continue,
            Ok(ReadOutcome::Missing) => String::new(),
            Ok(ReadOutcome::Refused(e)) => {
                lid_problem = Some(format!("{}: {e}", lid_path.display()));
                String::new()
            }
            Err(e) => {
                errors.push(e);
                String::new()
            }
        };
        let mut counters = Vec::with_capacity(COUNTER_SOURCES.len());
        for (candidates, factor, field) in COUNTER_SOURCES {
            let mut found = candidates
                .iter()
                .map(|rel| pdir.join(rel))
                .filter(|path| path.is_file());
            if let Some(path) = found.next() {
                counters.push(Counter {
                    field: *field,
                    file: KeptFile::new(path),
                    fallback: found.next().map(KeptFile::new),
                    on_fallback: false,
                    factor: *factor,
                });
            }
        }
        let dir_file = File::open(&pdir)
            .and_then(|f| f.metadata().map(|m| (f, DirStamp::of(&m))))
            .ok();
        ports.push(Port {
            label: format!("{name}/{num}"),
            state: KeptFile::new(pdir.join("state")),
            phys_state: KeptFile::new(pdir.join("phys_state")),
            rate: KeptFile::new(pdir.join("rate")),
            rate_text: String::new(),
            hw: walk_hw(&pdir, hw_counters, errors),
            dir_file,
            link_layer,
            lid,
            lid_problem,
            counters,
            num,
            dir: pdir,
        });
    }
    Some(Device {
        hca_type: read_text(&dir.join("hca_type"), buf, errors),
        board_id: read_text(&dir.join("board_id"), buf, errors),
        fw_ver: read_text(&dir.join("fw_ver"), buf, errors),
        node_guid: read_text(&dir.join("node_guid"), buf, errors),
        hw: walk_hw(&dir, hw_counters, errors),
        name,
        dir,
        ports,
    })
}
