//! `infiniband`: InfiniBand and RoCE HCAs and ports, from
//! `<sysfs>/class/infiniband/<device>/ports/<n>/`: link state and rate, the
//! PMA port counters (`counters/`, or the legacy `counters_ext/` 64-bit ones)
//! and the driver-specific `hw_counters/` (mlx5: congestion and retransmission
//! counts that RoCE tuning lives on).
//!
//! The directory walk is cached: every tick lists `class/infiniband` (one
//! directory read) and redoes the walk only when that list changes, when a file
//! of the cached walk went missing (hot-unplug, driver reload), when a port's
//! directory changed, or once a minute of ticks. The files read every tick
//! (state, phys_state, rate, counters, hw_counters) stay open between walks and
//! are re-read with one `pread` each ([`KeptFile`]); what describes rather than
//! measures (link layer, LID, HCA identity) is read at the walk only.
//!
//! A port or device that vanishes mid-read leaves no row this tick and no
//! error; a file a driver lacks leaves a null; a read the driver refuses
//! (`EINVAL`, `EIO`: a port query that failed) leaves a null and a problem for
//! `vtax doctor`. A file that reads but holds what the kernel never writes
//! (truncated, non-number, overflow, unknown state) costs only its own value:
//! a null counter or state, an empty tag, or a device left out when its
//! `ports/` cannot be listed. The other values, ports and devices are read,
//! and the file is named in `source_errors` at every tick while it stays bad
//! (what the walk reads, at every tick until the walk that finds it mended,
//! at most a minute of ticks later). The tick fails only when nothing could
//! be read.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::anyhow;
use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

use super::kept::KeptFile;
use super::{Availability, Collector, ParseError, Roots};

/// `[collectors.infiniband]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InfinibandConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
    /// Whether to read the driver-specific `hw_counters/` too.
    pub hw_counters: bool,
    /// Devices to read (names under `class/infiniband`); empty reads all.
    pub devices: Vec<String>,
}

impl Default for InfinibandConfig {
    fn default() -> Self {
        InfinibandConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            hw_counters: true,
            devices: Vec::new(),
        }
    }
}

crate::collectors::common_settings!(InfinibandConfig);

impl crate::collectors::Registered for InfinibandConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn build(
        &self,
        _all: &crate::collectors::CollectorsConfig,
        roots: &crate::collectors::Roots,
    ) -> Box<dyn crate::collectors::Collector> {
        Box::new(Infiniband::new(self, roots))
    }
}

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[
    (
        "hw_counters",
        "Also read the driver-specific hw_counters of every port and device (mlx5: out_of_buffer, np_cnp_sent, rp_cnp_handled, ...) into the infiniband_hw table.",
    ),
    (
        "devices",
        "Read only these RDMA devices, by their name under /sys/class/infiniband (e.g. [\"mlx5_0\", \"mlx5_1\"]); empty reads every device.",
    ),
];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&PORT, &LINK, &DEVICE, &HW_COUNTER];

const fn gauge(name: &'static str, ty: FieldType, unit: Unit, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, ty, unit, help)
}

const fn counter(name: &'static str, unit: Unit, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, unit, help)
}

const DEVICE_TAG: TagDef = TagDef {
    name: "device",
    help: "RDMA device name under /sys/class/infiniband (e.g. mlx5_0).",
};

const PORT_TAG: TagDef = TagDef {
    name: "port",
    help: "Port number on the device, from 1.",
};

vtax_store::table! {
    /// Numbers and counters of one port.
    pub static PORT: TableDef, pub struct PortRow {
        name: "infiniband_port",
        help: "One row per InfiniBand or RoCE port per tick: link state, rate and the PMA port counters from /sys/class/infiniband/<device>/ports/<port>/. Counters the driver lacks are null. The 16-bit and smaller error counters stop at their maximum instead of wrapping.",
        tags: [device = DEVICE_TAG, port = PORT_TAG],
        fields: [
            state: Option<u64> = gauge(
                FieldType::U64,
                Unit::None,
                "Logical port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER (the text is in infiniband_link).",
            ),
            phys_state: Option<u64> = gauge(
                FieldType::U64,
                Unit::None,
                "Physical port state: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test.",
            ),
            rate_bytes_per_second: Option<f64> = gauge(
                FieldType::F64,
                Unit::BytesPerSecond,
                "Signalling rate of the link as the kernel reports it (e.g. 400 Gb/sec is 5e10 bytes per second).",
            ),
            xmit_data_bytes: Option<u64> = counter(
                Unit::Bytes,
                "Data bytes sent on all VLs: port_xmit_data (kernel counts 4-byte words) times 4; from the legacy counters_ext/ only where counters/ is stuck at 2^32-1.",
            ),
            rcv_data_bytes: Option<u64> = counter(
                Unit::Bytes,
                "Data bytes received on all VLs: port_rcv_data (kernel counts 4-byte words) times 4; from the legacy counters_ext/ only where counters/ is stuck at 2^32-1.",
            ),
            xmit_packets: Option<u64> = counter(Unit::None, "Packets sent on all VLs."),
            rcv_packets: Option<u64> = counter(Unit::None, "Packets received on all VLs."),
            unicast_xmit_packets: Option<u64> = counter(Unit::None, "Unicast packets sent."),
            unicast_rcv_packets: Option<u64> = counter(Unit::None, "Unicast packets received."),
            multicast_xmit_packets: Option<u64> = counter(Unit::None, "Multicast packets sent."),
            multicast_rcv_packets: Option<u64> = counter(Unit::None, "Multicast packets received."),
            xmit_wait: Option<u64> = counter(
                Unit::None,
                "Ticks during which the port had data to send but no flow-control credits (port_xmit_wait): congestion towards the peer. 32 bits; the tick length is the device's sampling period.",
            ),
            symbol_error: Option<u64> = counter(
                Unit::None,
                "Minor link errors detected on a physical lane (cable, transceiver).",
            ),
            rcv_errors: Option<u64> = counter(
                Unit::None,
                "Received packets with errors (port_rcv_errors).",
            ),
            rcv_remote_physical_errors: Option<u64> = counter(
                Unit::None,
                "Received packets marked with the EBP delimiter: damaged upstream.",
            ),
            rcv_switch_relay_errors: Option<u64> = counter(
                Unit::None,
                "Received packets discarded because they could not be forwarded.",
            ),
            xmit_discards: Option<u64> = counter(
                Unit::None,
                "Outbound packets discarded because the port was down or congested.",
            ),
            xmit_constraint_errors: Option<u64> = counter(
                Unit::None,
                "Outbound packets not sent because of partition or rate-limit constraints.",
            ),
            rcv_constraint_errors: Option<u64> = counter(
                Unit::None,
                "Inbound packets discarded because of partition or rate-limit constraints.",
            ),
            local_link_integrity_errors: Option<u64> = counter(
                Unit::None,
                "Times the local physical errors exceeded the link's threshold.",
            ),
            excessive_buffer_overrun_errors: Option<u64> = counter(
                Unit::None,
                "Times consecutive receive buffer overruns exceeded the threshold.",
            ),
            vl15_dropped: Option<u64> = counter(
                Unit::None,
                "Subnet management packets (VL15) dropped for lack of buffers.",
            ),
            link_error_recovery: Option<u64> = counter(
                Unit::None,
                "Times the link error recovery process completed successfully.",
            ),
            link_downed: Option<u64> = counter(
                Unit::None,
                "Times the link failed to recover from errors and went down.",
            ),
        ],
        exported: true,
    }
}

/// Fills one counter field of a [`PortRow`].
type CounterField = for<'r, 'a> fn(&'r mut PortRow<'a>) -> &'r mut Option<u64>;

/// Where each counter of [`PORT`] comes from: candidate files under the port
/// directory in order of preference, the factor to bytes or packets, and the
/// field it fills.
///
/// `counters/` comes first, as node_exporter reads it: on current kernels
/// its traffic counters are 64-bit (the kernel asks the HCA for the extended
/// PMA counters where it has them). The legacy `counters_ext/` (mlx4 only)
/// is read only where `counters/` lacks the file or is stuck at 2^32-1 (an
/// old kernel's 32-bit counter that saturated), and then only while it reads
/// at least as much: a ConnectX-3 may leave every `counters_ext/` file at 0
/// while `counters/` counts billions, and a source stuck at zero must never
/// replace one that counts.
static COUNTER_SOURCES: &[(&[&str], u64, CounterField)] = &[
    (
        &["counters/port_xmit_data", "counters_ext/port_xmit_data_64"],
        4,
        |r| &mut r.xmit_data_bytes,
    ),
    (
        &["counters/port_rcv_data", "counters_ext/port_rcv_data_64"],
        4,
        |r| &mut r.rcv_data_bytes,
    ),
    (
        &[
            "counters/port_xmit_packets",
            "counters_ext/port_xmit_packets_64",
        ],
        1,
        |r| &mut r.xmit_packets,
    ),
    (
        &[
            "counters/port_rcv_packets",
            "counters_ext/port_rcv_packets_64",
        ],
        1,
        |r| &mut r.rcv_packets,
    ),
    (
        &[
            "counters/unicast_xmit_packets",
            "counters_ext/port_unicast_xmit_packets",
        ],
        1,
        |r| &mut r.unicast_xmit_packets,
    ),
    (
        &[
            "counters/unicast_rcv_packets",
            "counters_ext/port_unicast_rcv_packets",
        ],
        1,
        |r| &mut r.unicast_rcv_packets,
    ),
    (
        &[
            "counters/multicast_xmit_packets",
            "counters_ext/port_multicast_xmit_packets",
        ],
        1,
        |r| &mut r.multicast_xmit_packets,
    ),
    (
        &[
            "counters/multicast_rcv_packets",
            "counters_ext/port_multicast_rcv_packets",
        ],
        1,
        |r| &mut r.multicast_rcv_packets,
    ),
    (&["counters/port_xmit_wait"], 1, |r| &mut r.xmit_wait),
    (&["counters/symbol_error"], 1, |r| &mut r.symbol_error),
    (&["counters/port_rcv_errors"], 1, |r| &mut r.rcv_errors),
    (&["counters/port_rcv_remote_physical_errors"], 1, |r| {
        &mut r.rcv_remote_physical_errors
    }),
    (&["counters/port_rcv_switch_relay_errors"], 1, |r| {
        &mut r.rcv_switch_relay_errors
    }),
    (&["counters/port_xmit_discards"], 1, |r| {
        &mut r.xmit_discards
    }),
    (&["counters/port_xmit_constraint_errors"], 1, |r| {
        &mut r.xmit_constraint_errors
    }),
    (&["counters/port_rcv_constraint_errors"], 1, |r| {
        &mut r.rcv_constraint_errors
    }),
    (&["counters/local_link_integrity_errors"], 1, |r| {
        &mut r.local_link_integrity_errors
    }),
    (&["counters/excessive_buffer_overrun_errors"], 1, |r| {
        &mut r.excessive_buffer_overrun_errors
    }),
    (&["counters/VL15_dropped"], 1, |r| &mut r.vl15_dropped),
    (&["counters/link_error_recovery"], 1, |r| {
        &mut r.link_error_recovery
    }),
    (&["counters/link_downed"], 1, |r| &mut r.link_downed),
];

const INFO_HELP: &str = "Always 1; the row's tags carry the information.";

vtax_store::table! {
    /// The text attributes of a port, as tags of an info row.
    pub static LINK: TableDef, pub struct LinkRow {
        name: "infiniband_link",
        help: "One row per port per tick whose tags hold the port's text attributes (state, physical state, rate, link layer, LID); join on device and port.",
        tags: [
            device = DEVICE_TAG,
            port = PORT_TAG,
            link_layer = TagDef {
                name: "link_layer",
                help: "InfiniBand, or Ethernet for RoCE.",
            },
            state = TagDef {
                name: "state",
                help: "Logical port state text: DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER.",
            },
            phys_state = TagDef {
                name: "phys_state",
                help: "Physical port state text: Sleep, Polling, Disabled, PortConfigurationTraining, LinkUp, LinkErrorRecovery, Phy Test.",
            },
            rate = TagDef {
                name: "rate",
                help: "Rate as the kernel writes it, e.g. \"400 Gb/sec (4X NDR)\"; empty when unreadable.",
            },
            lid = TagDef {
                name: "lid",
                help: "Local identifier the subnet manager assigned (hex, 0x0 for RoCE or before assignment); empty when unreadable.",
            },
        ],
        fields: [info: u64 = gauge(FieldType::U64, Unit::None, INFO_HELP)],
        exported: true,
    }
}

vtax_store::table! {
    /// The identity of a device, as tags of an info row.
    pub static DEVICE: TableDef, pub struct DeviceRow {
        name: "infiniband_device",
        help: "One row per RDMA device per tick whose tags identify the HCA; empty where the driver lacks the file.",
        tags: [
            device = DEVICE_TAG,
            hca_type = TagDef {
                name: "hca_type",
                help: "HCA type (e.g. MT4129 for ConnectX-7).",
            },
            board_id = TagDef {
                name: "board_id",
                help: "Board identifier (PSID, e.g. MT_0000000838).",
            },
            fw_ver = TagDef {
                name: "fw_ver",
                help: "Firmware version.",
            },
            node_guid = TagDef {
                name: "node_guid",
                help: "Node GUID.",
            },
        ],
        fields: [info: u64 = gauge(FieldType::U64, Unit::None, INFO_HELP)],
        exported: true,
    }
}

vtax_store::table! {
    /// Driver-specific counters, one row per counter.
    pub static HW_COUNTER: TableDef, pub struct HwCounterRow {
        name: "infiniband_hw",
        help: "One row per driver-specific counter per tick, from hw_counters/ of a port (or of the device, port empty); names vary by driver (mlx5: out_of_buffer, out_of_sequence, np_cnp_sent, rp_cnp_handled, roce_adp_retrans, ...). The lifespan setting is not a counter and is left out.",
        tags: [
            device = DEVICE_TAG,
            port = TagDef {
                name: "port",
                help: "Port number on the device; empty for device-wide counters.",
            },
            counter = TagDef {
                name: "counter",
                help: "Counter name: the file name under hw_counters/.",
            },
        ],
        fields: [value: Option<u64> = counter(
            Unit::None,
            "The counter's value as the driver reports it.",
        )],
        exported: true,
    }
}

/// A file this long is not a sysfs attribute, which holds less than a page
/// (64 KiB on some arm64 kernels).
const READ_LIMIT: usize = 1 << 16;

/// Ticks between two walks of the tree when nothing asked for one sooner.
const RESCAN_TICKS: u64 = 60;

/// What the kernel writes in a counter file when the device has no
/// performance management agent to ask.
const NO_PMA: &str = "N/A (no PMA)";

/// The logical port states the kernel names (`enum ib_port_state`).
const STATES: &[&str] = &["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"];

/// The physical port states the kernel names, from 1.
const PHYS_STATES: &[&str] = &[
    "Sleep",
    "Polling",
    "Disabled",
    "PortConfigurationTraining",
    "LinkUp",
    "LinkErrorRecovery",
    "Phy Test",
];

const ACTIVE: u64 = 4;
const LINK_UP: u64 = 5;

/// A driver-specific counter file.
#[derive(Debug)]
struct HwCounter {
    name: String,
    file: KeptFile,
}

/// A PMA counter of [`PORT`] and the files chosen for it at the walk.
#[derive(Debug)]
struct Counter {
    /// The field it fills.
    field: CounterField,
    /// The first candidate of [`COUNTER_SOURCES`] that exists.
    file: KeptFile,
    /// A later candidate (`counters_ext/`), read only while `file` is
    /// stuck at 2^32-1.
    fallback: Option<KeptFile>,
    /// To bytes (4 for the data counters, in 4-byte words) or packets (1).
    factor: u64,
}

/// What a 32-bit PMA counter reads once it saturated.
const SATURATED_32_BITS: u64 = u32::MAX as u64;

/// What `fstat` says of a port directory; any change means entries came or
/// went (on a regular filesystem, where a file deleted under an open
/// descriptor stays readable; sysfs answers ENODEV instead).
#[derive(Debug, PartialEq, Eq)]
struct DirStamp {
    nlink: u64,
    size: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl DirStamp {
    fn of(meta: &std::fs::Metadata) -> Self {
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
struct Port {
    num: String,
    /// `device/port`, for problems and `probe`.
    label: String,
    dir: PathBuf,
    /// The port directory held open, and how it looked at the walk: one
    /// `fstat` a tick tells whether the port (or part of it) went away.
    dir_file: Option<(File, DirStamp)>,
    state: KeptFile,
    phys_state: KeptFile,
    rate: KeptFile,
    /// The text of `rate` at the last read, kept to spare an allocation a tick.
    rate_text: String,
    link_layer: String,
    lid: String,
    /// The problem the walk's read of `lid` had (the driver refused it),
    /// repeated every tick.
    lid_problem: Option<String>,
    counters: Vec<Counter>,
    hw: Vec<HwCounter>,
}

impl Port {
    /// Whether the port directory is no longer as the walk found it (or its
    /// metadata cannot be read). One `fstat`. Where the walk could not open
    /// the directory, the kept `state` file says at least whether the port
    /// was deleted.
    fn dir_changed(&self) -> bool {
        match &self.dir_file {
            Some((file, stamp)) => file.metadata().map_or(true, |m| DirStamp::of(&m) != *stamp),
            None => self.state.is_deleted(),
        }
    }

    /// Closes every kept file, so the next reads go through the paths again.
    fn close_files(&mut self) {
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
struct Device {
    name: String,
    dir: PathBuf,
    hca_type: String,
    board_id: String,
    fw_ver: String,
    node_guid: String,
    hw: Vec<HwCounter>,
    ports: Vec<Port>,
}

/// What a port looked like at the last tick, for `probe`: indices into
/// `devices` and its `ports`.
#[derive(Debug)]
struct PortSeen {
    device: usize,
    port: usize,
    state: &'static str,
    rate: Option<u64>,
}

/// How a read went.
enum ReadOutcome<'a> {
    /// The file's text (in the reused buffer).
    Read(&'a str),
    /// The file is not there (`ENOENT`, or `ENODEV` for a removed device).
    Missing,
    /// The driver refused the read (`EINVAL`, `EIO`, ...).
    Refused(io::Error),
}

/// The infiniband collector.
pub struct Infiniband {
    class_dir: PathBuf,
    hw_counters: bool,
    devices_wanted: Vec<String>,
    /// Sorted entries of `class_dir` at the last walk; `None` when it was absent.
    listed: Option<Vec<OsString>>,
    devices: Vec<Device>,
    stale: bool,
    ticks: u64,
    buf: Vec<u8>,
    listing: Vec<OsString>,
    port_rows: BatchBuilder,
    link_rows: BatchBuilder,
    device_rows: BatchBuilder,
    hw_rows: BatchBuilder,
    hw_values: Vec<Option<u64>>,
    seen: Vec<PortSeen>,
    problems: Vec<String>,
    /// Files that read badly at the last walk (link layer, LID, HCA identity,
    /// a `ports/` or `hw_counters/` listing), named again at every tick.
    walk_errors: Vec<ParseError>,
    /// Files that read badly at the last tick, the walk's included: each
    /// costs only its own value (or its device), not the other ports'.
    errors: Vec<ParseError>,
}

impl Infiniband {
    /// An infiniband collector reading under `roots`.
    pub fn new(config: &InfinibandConfig, roots: &Roots) -> Self {
        Infiniband {
            class_dir: roots.sys("class/infiniband"),
            hw_counters: config.hw_counters,
            devices_wanted: config.devices.clone(),
            listed: None,
            devices: Vec::new(),
            stale: true,
            ticks: 0,
            buf: Vec::new(),
            listing: Vec::new(),
            port_rows: BatchBuilder::new(&PORT),
            link_rows: BatchBuilder::new(&LINK),
            device_rows: BatchBuilder::new(&DEVICE),
            hw_rows: BatchBuilder::new(&HW_COUNTER),
            hw_values: Vec::new(),
            seen: Vec::new(),
            problems: Vec::new(),
            walk_errors: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// Lists `class_dir` into `self.listing`, sorted; `false` when it is absent.
    fn list_class_dir(&mut self) -> anyhow::Result<bool> {
        self.listing.clear();
        let entries = match std::fs::read_dir(&self.class_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(anyhow!("{}: {e}", self.class_dir.display())),
        };
        for entry in entries {
            let entry = entry.map_err(|e| anyhow!("{}: {e}", self.class_dir.display()))?;
            self.listing.push(entry.file_name());
        }
        self.listing.sort();
        Ok(true)
    }

    /// Walks the tree again if the device list changed, a cached file went
    /// missing, or the walk is old.
    fn refresh(&mut self) -> anyhow::Result<()> {
        let present = self.list_class_dir()?;
        let same_list = match &self.listed {
            Some(listed) => present && *listed == self.listing,
            None => !present,
        };
        if same_list && !self.stale && !self.ticks.is_multiple_of(RESCAN_TICKS) {
            return Ok(());
        }
        self.listed = present.then(|| self.listing.clone());
        self.devices.clear();
        self.walk_errors.clear();
        // Until this walk completes, the next tick walks again.
        self.stale = true;
        if !present {
            self.stale = false;
            return Ok(());
        }
        let mut names: Vec<String> = self
            .listing
            .iter()
            .filter_map(|n| n.to_str().map(str::to_owned))
            .filter(|n| self.devices_wanted.is_empty() || self.devices_wanted.contains(n))
            .collect();
        names.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
        for name in names {
            // Real sysfs holds symlinks to the device under /sys/devices: join
            // and read through them (metadata and read_dir follow links).
            let dir = self.class_dir.join(&name);
            let errors = &mut self.walk_errors;
            if let Some(device) = walk_device(name, dir, self.hw_counters, &mut self.buf, errors) {
                self.devices.push(device);
            }
        }
        self.stale = false;
        Ok(())
    }

    /// Reads every cached port once and fills the builders.
    fn read_all(&mut self, time_us: i64) -> anyhow::Result<()> {
        let Infiniband {
            devices,
            buf,
            port_rows,
            link_rows,
            device_rows,
            hw_rows,
            hw_values,
            seen,
            problems,
            errors,
            stale,
            ..
        } = self;
        for (device_index, device) in devices.iter_mut().enumerate() {
            let mut any_port = false;
            for (port_index, port) in device.ports.iter_mut().enumerate() {
                if port.dir_changed() {
                    // Gone, or files came or went: read through the paths this
                    // tick, as a fresh walk would, and walk again next tick.
                    port.close_files();
                    *stale = true;
                }
                let mut values = PortRow::default();
                // A port that went mid-read is no error: its files' are dropped.
                let errors_before = errors.len();
                let Some(link) = read_port(port, buf, &mut values, problems, errors, stale) else {
                    errors.truncate(errors_before);
                    continue;
                };
                hw_values.clear();
                if !read_hw(
                    &mut port.hw,
                    &port.dir,
                    buf,
                    hw_values,
                    problems,
                    errors,
                    stale,
                ) {
                    errors.truncate(errors_before);
                    continue; // the port went away between its counters and hw_counters
                }
                any_port = true;
                let rate_text = if link.rate.is_some() {
                    port.rate_text.as_str()
                } else {
                    ""
                };
                let row = PortRow {
                    device: &device.name,
                    port: &port.num,
                    ..values
                };
                port_rows.push_row(time_us, &row)?;
                link_rows.push_row(
                    time_us,
                    &LinkRow {
                        device: &device.name,
                        port: &port.num,
                        link_layer: &port.link_layer,
                        state: link.state,
                        phys_state: link.phys_state,
                        rate: rate_text,
                        lid: &port.lid,
                        info: 1,
                    },
                )?;
                for (hw, value) in port.hw.iter().zip(hw_values.iter()) {
                    hw_rows.push_row(
                        time_us,
                        &HwCounterRow {
                            device: &device.name,
                            port: &port.num,
                            counter: &hw.name,
                            value: *value,
                        },
                    )?;
                }
                port_problems(&link, &row, port, problems);
                seen.push(PortSeen {
                    device: device_index,
                    port: port_index,
                    state: link.state,
                    rate: link.rate,
                });
            }
            if !any_port && !device.dir.exists() {
                *stale = true;
                continue; // the device went away
            }
            hw_values.clear();
            let errors_before = errors.len();
            if read_hw(
                &mut device.hw,
                &device.dir,
                buf,
                hw_values,
                problems,
                errors,
                stale,
            ) {
                for (hw, value) in device.hw.iter().zip(hw_values.iter()) {
                    hw_rows.push_row(
                        time_us,
                        &HwCounterRow {
                            device: &device.name,
                            port: "",
                            counter: &hw.name,
                            value: *value,
                        },
                    )?;
                }
            } else {
                errors.truncate(errors_before);
            }
            device_rows.push_row(
                time_us,
                &DeviceRow {
                    device: &device.name,
                    hca_type: &device.hca_type,
                    board_id: &device.board_id,
                    fw_ver: &device.fw_ver,
                    node_guid: &device.node_guid,
                    info: 1,
                },
            )?;
        }
        Ok(())
    }

    /// Why there is nothing to read, when there is nothing.
    fn absent_reason(&self) -> Option<String> {
        let dir = self.class_dir.display();
        if self.listed.is_none() {
            return Some(format!("no {dir}: no RDMA devices or driver not loaded"));
        }
        if self.devices.is_empty() {
            if self.listing.is_empty() {
                return Some(format!("{dir} is empty: no RDMA devices"));
            }
            if !self.devices_wanted.is_empty() {
                return Some(format!(
                    "none of collectors.infiniband.devices ({}) is under {dir}",
                    self.devices_wanted.join(", ")
                ));
            }
            return Some(format!("no device under {dir} could be read"));
        }
        None
    }
}

impl Collector for Infiniband {
    fn name(&self) -> &'static str {
        "infiniband"
    }

    fn probe(&mut self) -> Availability {
        self.stale = true;
        if let Err(e) = self.collect(0) {
            // No class dir lists as none (`absent_reason`); an error here is
            // a source that reads badly, probed again until it mends.
            return Availability::Failed(format!("{e:#}"));
        }
        if let Some(reason) = self.absent_reason() {
            return Availability::Absent(reason);
        }
        let ports: Vec<String> = self
            .seen
            .iter()
            .map(|p| {
                let port = &self.devices[p.device].ports[p.port];
                let rate = p
                    .rate
                    .map(|bits| format!(" {} Gb/s", format_gbits(bits)))
                    .unwrap_or_default();
                let layer = match port.link_layer.as_str() {
                    "InfiniBand" => " IB",
                    "Ethernet" => " RoCE",
                    _ => "",
                };
                format!("{} {}{rate}{layer}", port.label, p.state)
            })
            .collect();
        Availability::Available(format!(
            "{} HCA{}, {} port{}: {}",
            self.devices.len(),
            plural(self.devices.len()),
            ports.len(),
            plural(ports.len()),
            ports.join(", ")
        ))
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        self.problems.clear();
        self.seen.clear();
        self.errors.clear();
        self.refresh()?;
        self.ticks = self.ticks.wrapping_add(1);
        self.errors.extend(self.walk_errors.iter().cloned());
        let result = self.read_all(time_us);
        // Finish every builder even on error so no half-tick leaks into the next.
        let batches = [
            self.port_rows.finish(),
            self.link_rows.finish(),
            self.device_rows.finish(),
            self.hw_rows.finish(),
        ];
        result?;
        if batches.iter().all(|b| b.is_empty()) && !self.errors.is_empty() {
            // Nothing read well: the source is bad, not a file of it.
            return Err(self.errors.remove(0).into());
        }
        for wanted in &self.devices_wanted {
            if !self.devices.iter().any(|d| &d.name == wanted) {
                self.problems.push(format!(
                    "collectors.infiniband.devices names {wanted}, which is not under {}",
                    self.class_dir.display()
                ));
            }
        }
        Ok(batches.into_iter().filter(|b| !b.is_empty()).collect())
    }

    fn problems(&self) -> Vec<String> {
        self.problems.clone()
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.errors.clone()
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Sorts `mlx5_2` before `mlx5_10`.
fn natural_key(name: &str) -> (&str, u64, &str) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, number) = name.split_at(name.len() - digits);
    (stem, number.parse().unwrap_or(0), name)
}

/// Gb/s with at most the decimals needed ("400", "2.5", "14.0625").
fn format_gbits(bits: u64) -> String {
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
fn bad(path: &Path, reason: impl Into<String>) -> ParseError {
    ParseError {
        path: path.display().to_string(),
        line: 0,
        reason: reason.into(),
    }
}

/// Reads a kept file into `buf` (one `pread` once it is open).
fn read_kept<'b>(file: &mut KeptFile, buf: &'b mut Vec<u8>) -> Result<ReadOutcome<'b>, ParseError> {
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
        Err(e) if super::kept::is_gone(&e) => Ok(ReadOutcome::Missing),
        Err(e) => Ok(ReadOutcome::Refused(e)),
    }
}

/// Reads `path` once (open, `pread`, close): for what the walk reads.
fn read_path<'b>(path: &Path, buf: &'b mut Vec<u8>) -> Result<ReadOutcome<'b>, ParseError> {
    read_kept(&mut KeptFile::new(path.to_owned()), buf)
}

/// A device-level text attribute read at walk time; empty when absent, or
/// when it reads badly (then named in `errors`).
fn read_text(path: &Path, buf: &mut Vec<u8>, errors: &mut Vec<ParseError>) -> String {
    match read_path(path, buf) {
        Ok(ReadOutcome::Read(text)) => text.trim().to_owned(),
        Ok(ReadOutcome::Missing | ReadOutcome::Refused(_)) => String::new(),
        Err(e) => {
            errors.push(e);
            String::new()
        }
    }
}

/// Names of the regular files in `dir`, sorted; empty if there is no `dir`.
fn list_files(dir: &Path) -> Result<Vec<String>, ParseError> {
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

/// The `hw_counters/` of a port or device; none, named in `errors`, when
/// the directory cannot be listed.
fn walk_hw(dir: &Path, enabled: bool, errors: &mut Vec<ParseError>) -> Vec<HwCounter> {
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
        .filter(|name| name != "lifespan")
        .map(|name| HwCounter {
            file: KeptFile::new(dir.join(&name)),
            name,
        })
        .collect()
}

/// Walks one device; `None` if it vanished meanwhile or its ports cannot be
/// listed (then named in `errors`). A port's link layer or LID that reads
/// badly is left empty and named in `errors`; the port is read.
fn walk_device(
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

/// The text attributes of a port read this tick (the rest is in [`Port`]).
struct Link {
    state: &'static str,
    phys_state: &'static str,
    rate: Option<u64>,
}

/// Reads one file of a port: `Some(Some(text))`, `Some(None)` when absent,
/// refused or read badly (a null; a bad read is named in `errors`), `None`
/// when the port is gone.
fn read_port_file<'b>(
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
fn read_port(
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
                        }
                        Some(m) => problems.push(format!(
                            "{}: stuck at 2^32-1, and {} reads {m}, less: neither counts",
                            counter.file.path().display(),
                            fallback.path().display()
                        )),
                        None => {}
                    }
                }
                None if counter.factor == 4 => problems.push(format!(
                    "{}: stuck at 2^32-1 (a 32-bit counter that saturated; this kernel or driver lacks the 64-bit extended counters)",
                    counter.file.path().display()
                )),
                None => {}
            }
        }
        let factor = counter.factor;
        let scaled = n
            .checked_mul(factor)
            .ok_or_else(|| format!("{n} times {factor} overflows 64 bits"));
        if let Some(scaled) = parsed!(scaled, source) {
            *(counter.field)(values) = Some(scaled);
        }
    }
    Some(link)
}

/// Reads hw_counters into `values`; `false` if their owner vanished. A
/// counter that reads badly is a null, named in `errors`.
fn read_hw(
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
fn parse_counter(text: &str) -> Result<Option<u64>, String> {
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
fn parse_state(
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
fn port_problems(link: &Link, row: &PortRow, port: &Port, problems: &mut Vec<String>) {
    let label = &port.label;
    let (state, phys) = (row.state, row.phys_state);
    if state.is_some_and(|s| s != ACTIVE) || phys.is_some_and(|p| p != LINK_UP) {
        let why = match (phys, port.link_layer.as_str()) {
            (Some(2), _) => "no link: check the cable, transceiver and the peer's port",
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use vtax_store::batch::Values;

    fn fixture() -> PathBuf {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/baremetal-node"
        ))
    }

    fn roots(node: &Path) -> Roots {
        Roots {
            procfs: node.join("proc"),
            sysfs: node.join("sys"),
            ..Roots::default()
        }
    }

    fn collector(node: &Path) -> Infiniband {
        Infiniband::new(&InfinibandConfig::default(), &roots(node))
    }

    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_tree(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }

    /// A copy of the fixture's infiniband tree in a temporary directory.
    fn fixture_copy() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(
            &fixture().join("sys/class/infiniband"),
            &dir.path().join("sys/class/infiniband"),
        );
        dir
    }

    fn batch<'a>(batches: &'a [Batch], table: &TableDef) -> &'a Batch {
        batches
            .iter()
            .find(|b| b.table.name == table.name)
            .unwrap_or_else(|| panic!("no {} batch", table.name))
    }

    fn tag(b: &Batch, name: &str, row: usize) -> String {
        let column = &b.tags[b.table.tag_index(name).unwrap()];
        column.dict[column.codes[row] as usize].clone()
    }

    /// The row of `device`/`port` in a batch tagged with both.
    fn row(b: &Batch, device: &str, port: &str) -> usize {
        (0..b.len())
            .find(|&r| tag(b, "device", r) == device && tag(b, "port", r) == port)
            .unwrap_or_else(|| panic!("no row for {device}/{port}"))
    }

    fn u64_at(b: &Batch, field: &str, row: usize) -> Option<u64> {
        let column = &b.fields[b.table.field_index(field).unwrap()];
        if !column.is_valid(row) {
            return None;
        }
        match &column.values {
            Values::U64(v) => Some(v[row]),
            other => panic!("{field} is {other:?}"),
        }
    }

    fn f64_at(b: &Batch, field: &str, row: usize) -> Option<f64> {
        let column = &b.fields[b.table.field_index(field).unwrap()];
        if !column.is_valid(row) {
            return None;
        }
        match &column.values {
            Values::F64(v) => Some(v[row]),
            other => panic!("{field} is {other:?}"),
        }
    }

    fn hw_value(b: &Batch, device: &str, port: &str, counter: &str) -> Option<u64> {
        let r = (0..b.len()).find(|&r| {
            tag(b, "device", r) == device
                && tag(b, "port", r) == port
                && tag(b, "counter", r) == counter
        })?;
        u64_at(b, "value", r)
    }

    #[test]
    fn tables_are_valid_and_columns_line_up() {
        for table in TABLES {
            table.validate().unwrap();
            assert!(table.name.starts_with("infiniband"));
        }
        // Every counter source fills a field of its own, and every field
        // but the three read from the port's attributes has one; the first
        // (preferred) source is the `counters/` file the field is named after.
        let mut filled = Vec::new();
        for (sources, _, field) in COUNTER_SOURCES {
            let mut row = PortRow::default();
            *field(&mut row) = Some(1);
            let mut rows = BatchBuilder::new(&PORT);
            rows.push_row(0, &row).unwrap();
            let batch = rows.finish();
            let set: Vec<usize> = (0..PORT.fields.len())
                .filter(|&i| batch.fields[i].is_valid(0))
                .collect();
            assert_eq!(set.len(), 1, "{sources:?}");
            let name = PORT.fields[set[0]].name;
            assert!(!filled.contains(&name), "{sources:?} fills {name} again");
            filled.push(name);
            let first = sources[0].strip_prefix("counters/").unwrap();
            assert_eq!(
                first.trim_start_matches("port_").to_ascii_lowercase(),
                name.trim_end_matches("_bytes"),
                "{sources:?}"
            );
        }
        let attributes = ["state", "phys_state", "rate_bytes_per_second"];
        let unfilled: Vec<&str> = PORT
            .fields
            .iter()
            .map(|f| f.name)
            .filter(|name| !filled.contains(name))
            .collect();
        assert_eq!(unfilled, attributes);
    }

    #[test]
    fn fixture_values() {
        let mut c = collector(&fixture());
        let batches = c.collect(42).unwrap();
        let ports = batch(&batches, &PORT);
        assert_eq!(ports.len(), 9);
        assert!(ports.time_us.iter().all(|&t| t == 42));

        // port_xmit_data counts 4-byte words.
        let r = row(ports, "mlx5_0", "1");
        assert_eq!(
            u64_at(ports, "xmit_data_bytes", r),
            Some(1_029_384_756_102 * 4)
        );
        assert_eq!(
            u64_at(ports, "rcv_data_bytes", r),
            Some(918_273_645_123 * 4)
        );
        assert_eq!(u64_at(ports, "xmit_packets", r), Some(3_019_283_746));
        assert_eq!(u64_at(ports, "unicast_rcv_packets", r), Some(2_810_376_590));
        assert_eq!(u64_at(ports, "xmit_wait", r), Some(1204));
        assert_eq!(u64_at(ports, "state", r), Some(4));
        assert_eq!(u64_at(ports, "phys_state", r), Some(5));
        assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(50e9));

        // The congested port.
        let r = row(ports, "mlx5_2", "1");
        assert_eq!(u64_at(ports, "xmit_wait", r), Some(3_718_293_871));
        assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(50e9));
        let r = row(ports, "mlx5_4", "1");
        assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(25e9));

        // An older kernel's layout: the 64-bit counters_ext win over the
        // saturated 32-bit ones; what it lacks is null.
        let r = row(ports, "mlx5_3", "1");
        assert_eq!(
            u64_at(ports, "xmit_data_bytes", r),
            Some(73_839_029_384 * 4)
        );
        assert_eq!(u64_at(ports, "rcv_data_bytes", r), Some(69_120_394_857 * 4));
        assert_eq!(u64_at(ports, "xmit_packets", r), Some(9_028_371_625));
        assert_eq!(u64_at(ports, "rcv_packets", r), Some(8_812_734_410));
        assert_eq!(
            u64_at(ports, "unicast_xmit_packets", r),
            Some(9_028_360_001)
        );
        assert_eq!(u64_at(ports, "multicast_rcv_packets", r), Some(14_408));
        assert_eq!(u64_at(ports, "xmit_wait", r), None);

        // The port that is down.
        let r = row(ports, "mlx5_5", "1");
        assert_eq!(u64_at(ports, "state", r), Some(1));
        assert_eq!(u64_at(ports, "phys_state", r), Some(2));
        assert_eq!(u64_at(ports, "link_downed", r), Some(3));

        // The RoCE port and its mlx5 hw_counters; lifespan is a setting, not a counter.
        let r = row(ports, "mlx5_8", "1");
        assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(12.5e9));
        let hw = batch(&batches, &HW_COUNTER);
        assert_eq!(hw_value(hw, "mlx5_8", "1", "np_cnp_sent"), Some(120_410));
        assert_eq!(hw_value(hw, "mlx5_8", "1", "out_of_sequence"), Some(10));
        assert_eq!(
            hw_value(hw, "mlx5_0", "1", "rx_write_requests"),
            Some(48_232)
        );
        assert_eq!(hw_value(hw, "mlx5_8", "1", "lifespan"), None);
        assert_eq!(hw.len(), 8 * 19 + 29);

        let link = batch(&batches, &LINK);
        let r = row(link, "mlx5_8", "1");
        assert_eq!(tag(link, "link_layer", r), "Ethernet");
        assert_eq!(tag(link, "state", r), "ACTIVE");
        assert_eq!(tag(link, "phys_state", r), "LinkUp");
        assert_eq!(tag(link, "rate", r), "100 Gb/sec (4X EDR)");
        let r = row(link, "mlx5_1", "1");
        assert_eq!(tag(link, "link_layer", r), "InfiniBand");
        assert_eq!(tag(link, "lid", r), "0x1e");
        let r = row(link, "mlx5_5", "1");
        assert_eq!(tag(link, "state", r), "DOWN");
        assert_eq!(tag(link, "phys_state", r), "Polling");

        let devices = batch(&batches, &DEVICE);
        assert_eq!(devices.len(), 9);
        assert_eq!(tag(devices, "device", 0), "mlx5_0");
        assert_eq!(tag(devices, "hca_type", 0), "MT4129");
        assert_eq!(tag(devices, "fw_ver", 0), "28.39.2048");
        assert_eq!(tag(devices, "board_id", 0), "MT_0000000838");
        assert_eq!(tag(devices, "node_guid", 0), "946d:ae03:00f4:1a2c");

        let problems = c.problems();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("mlx5_5/1 is DOWN/Polling: no link")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("mlx5_5/1: link_downed = 3")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("mlx5_6/1: physical errors")
                    && p.contains("symbol_error = 12")),
            "{problems:?}"
        );
        // The saturated 32-bit counters of mlx5_3 are not read: no complaint.
        assert!(!problems.iter().any(|p| p.contains("2^32")), "{problems:?}");
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("mlx5_5/1: physical errors")
                    && p.contains("link_error_recovery = 3")),
            "{problems:?}"
        );
        assert_eq!(problems.len(), 4, "{problems:?}");
    }

    /// A ConnectX-3 (mlx4) on a current kernel: `counters/` counts in 64
    /// bits while every legacy `counters_ext/` file reads 0.
    #[test]
    fn mlx4_counters_ext_stuck_at_zero_never_replaces_counters() {
        let node = fixture().join("../mlx4-node");
        let mut c = collector(&node);
        let batches = c.collect(7).unwrap();
        let ports = batch(&batches, &PORT);
        let r = row(ports, "mlx4_0", "1");
        assert_eq!(u64_at(ports, "rcv_packets", r), Some(6_812_093_417));
        assert_eq!(u64_at(ports, "xmit_packets", r), Some(5_219_384_401));
        assert_eq!(
            u64_at(ports, "rcv_data_bytes", r),
            Some(2_718_428_417_305 * 4)
        );
        assert_eq!(
            u64_at(ports, "xmit_data_bytes", r),
            Some(1_904_827_361_192 * 4)
        );
        assert_eq!(u64_at(ports, "unicast_rcv_packets", r), Some(6_812_090_012));
        assert_eq!(u64_at(ports, "multicast_xmit_packets", r), Some(4284));
        assert_eq!(u64_at(ports, "xmit_wait", r), Some(88_231));
        assert!(c.problems().is_empty(), "{:?}", c.problems());
    }

    /// `counters/` saturated at 2^32-1: the `counters_ext/` value is taken
    /// only while it is at least as large; a stuck one is reported, and the
    /// saturated value stands.
    #[test]
    fn a_saturated_counter_falls_back_only_to_a_source_that_counts_more() {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&fixture().join("../mlx4-node/sys"), &dir.path().join("sys"));
        let port = dir.path().join("sys/class/infiniband/mlx4_0/ports/1");
        std::fs::write(port.join("counters/port_rcv_packets"), "4294967295\n").unwrap();
        std::fs::write(port.join("counters/port_xmit_packets"), "4294967295\n").unwrap();
        std::fs::write(
            port.join("counters_ext/port_xmit_packets_64"),
            "9000000000\n",
        )
        .unwrap();
        let mut c = collector(dir.path());
        let batches = c.collect(7).unwrap();
        let ports = batch(&batches, &PORT);
        let r = row(ports, "mlx4_0", "1");
        assert_eq!(u64_at(ports, "xmit_packets", r), Some(9_000_000_000));
        assert_eq!(u64_at(ports, "rcv_packets", r), Some(4_294_967_295));
        let problems = c.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("counters/port_rcv_packets: stuck at 2^32-1")
                && problems[0].contains("counters_ext/port_rcv_packets_64 reads 0"),
            "{problems:?}"
        );
        // Once the legacy file counts past it, it is read.
        std::fs::write(
            port.join("counters_ext/port_rcv_packets_64"),
            "7000000000\n",
        )
        .unwrap();
        let batches = c.collect(8).unwrap();
        let ports = batch(&batches, &PORT);
        let r = row(ports, "mlx4_0", "1");
        assert_eq!(u64_at(ports, "rcv_packets", r), Some(7_000_000_000));
        assert!(c.problems().is_empty(), "{:?}", c.problems());
    }

    #[test]
    fn probe_summarises_the_ports() {
        let mut c = collector(&fixture());
        let Availability::Available(summary) = c.probe() else {
            panic!("absent");
        };
        assert!(
            summary.starts_with(
                "9 HCAs, 9 ports: mlx5_0/1 ACTIVE 400 Gb/s IB, mlx5_1/1 ACTIVE 400 Gb/s IB, "
            ),
            "{summary}"
        );
        assert!(summary.contains("mlx5_5/1 DOWN 10 Gb/s IB"), "{summary}");
        assert!(
            summary.ends_with("mlx5_8/1 ACTIVE 100 Gb/s RoCE"),
            "{summary}"
        );
    }

    #[test]
    fn absent_without_rdma_devices() {
        let vm = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/vm-node"
        ));
        let mut c = collector(&vm);
        let Availability::Absent(reason) = c.probe() else {
            panic!("present");
        };
        assert!(
            reason.starts_with("no ")
                && reason.ends_with("sys/class/infiniband: no RDMA devices or driver not loaded"),
            "{reason}"
        );
        assert!(c.collect(1).unwrap().is_empty());

        let empty = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(empty.path().join("sys/class/infiniband")).unwrap();
        let Availability::Absent(reason) = collector(empty.path()).probe() else {
            panic!("present");
        };
        assert!(reason.ends_with("is empty: no RDMA devices"), "{reason}");
    }

    #[test]
    fn devices_and_hw_counters_settings() {
        let config = InfinibandConfig {
            devices: vec!["mlx5_8".into(), "mlx5_9".into()],
            hw_counters: false,
            ..InfinibandConfig::default()
        };
        let mut c = Infiniband::new(&config, &roots(&fixture()));
        let batches = c.collect(1).unwrap();
        assert_eq!(batch(&batches, &PORT).len(), 1);
        assert!(!batches.iter().any(|b| b.table.name == HW_COUNTER.name));
        assert_eq!(
            c.problems(),
            [format!(
                "collectors.infiniband.devices names mlx5_9, which is not under {}",
                fixture().join("sys/class/infiniband").display()
            )]
        );

        let config = InfinibandConfig {
            devices: vec!["mlx4_0".into()],
            ..InfinibandConfig::default()
        };
        let Availability::Absent(reason) = Infiniband::new(&config, &roots(&fixture())).probe()
        else {
            panic!("present");
        };
        assert!(
            reason.starts_with("none of collectors.infiniband.devices (mlx4_0)"),
            "{reason}"
        );
    }

    #[test]
    fn config_keys() {
        let config: InfinibandConfig =
            toml::from_str("hw_counters = false\ndevices = [\"mlx5_0\"]\n").unwrap();
        assert!(!config.hw_counters);
        assert_eq!(config.devices, ["mlx5_0"]);
        assert!(toml::from_str::<InfinibandConfig>("hw_counter = true\n").is_err());
        for key in ["hw_counters", "devices"] {
            assert!(KEY_DOCS.iter().any(|(k, _)| *k == key), "{key}");
        }
    }

    #[test]
    fn rates() {
        let gbit = 1_000_000_000;
        for (text, bits) in [
            ("100 Gb/sec (4X EDR)\n", 100 * gbit),
            ("400 Gb/sec (4X NDR)\n", 400 * gbit),
            ("200 Gb/sec (4X HDR)\n", 200 * gbit),
            ("25 Gb/sec (1X EDR)\n", 25 * gbit),
            ("10 Gb/sec (4X SDR)\n", 10 * gbit),
            ("2.5 Gb/sec (1X SDR)\n", 2_500_000_000),
            ("56 Gb/sec (4X FDR)\n", 56 * gbit),
            ("40 Gb/sec (4X FDR10)\n", 40 * gbit),
            ("800 Gb/sec (8X NDR)\n", 800 * gbit),
            ("14.0625 Gb/sec (1X FDR)\n", 14_062_500_000),
            ("10 Gb/sec\n", 10 * gbit),
            ("10 Gb/sec (4X)", 10 * gbit),
        ] {
            assert_eq!(parse_rate(text), Ok(bits), "{text:?}");
        }
        for bad in [
            "",
            "\n",
            "fast\n",
            "100 Mb/sec (4X EDR)\n",
            "100Gb/sec\n",
            "-1 Gb/sec (4X)\n",
            "1. Gb/sec\n",
            ".5 Gb/sec\n",
            "100 Gb/sec (4X EDR\n",
            "99999999999999999999 Gb/sec\n",
            "20000000000 Gb/sec\n",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_gbits(2_500_000_000), "2.5");
        assert_eq!(format_gbits(400 * gbit), "400");
    }

    #[test]
    fn states_and_counters() {
        assert_eq!(parse_state("4: ACTIVE\n", STATES, 0), Ok((4, "ACTIVE")));
        assert_eq!(
            parse_state("5: ACTIVE_DEFER\n", STATES, 0),
            Ok((5, "ACTIVE_DEFER"))
        );
        assert_eq!(parse_state("7: UNKNOWN\n", STATES, 0), Ok((7, "UNKNOWN")));
        assert_eq!(
            parse_state("5: LinkUp\n", PHYS_STATES, 1),
            Ok((5, "LinkUp"))
        );
        assert_eq!(
            parse_state("7: Phy Test\n", PHYS_STATES, 1),
            Ok((7, "Phy Test"))
        );
        assert_eq!(
            parse_state("9: <unknown>\n", PHYS_STATES, 1),
            Ok((9, "<unknown>"))
        );
        assert_eq!(
            parse_state("0: <unknown>\n", PHYS_STATES, 1),
            Ok((0, "<unknown>"))
        );
        for bad in [
            "4: ACTIV\n",
            "4: DOWN\n",
            "4:ACTIVE\n",
            ": ACTIVE\n",
            "x: ACTIVE\n",
            "",
            "4",
        ] {
            assert!(parse_state(bad, STATES, 0).is_err(), "{bad:?}");
        }
        assert_eq!(parse_counter("123\n"), Ok(Some(123)));
        assert_eq!(parse_counter("18446744073709551615\n"), Ok(Some(u64::MAX)));
        assert_eq!(parse_counter("N/A (no PMA)\n"), Ok(None));
        for bad in [
            "",
            "\n",
            "12x\n",
            "-1\n",
            "18446744073709551616\n",
            " 1\n",
            "1 2\n",
        ] {
            assert!(parse_counter(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_port_removed_between_ticks_stops_its_rows() {
        let dir = fixture_copy();
        let mut c = collector(dir.path());
        let first = c.collect(1).unwrap();
        assert_eq!(batch(&first, &PORT).len(), 9);
        let class = dir.path().join("sys/class/infiniband");
        std::fs::remove_dir_all(class.join("mlx5_7/ports/1")).unwrap();
        std::fs::remove_dir_all(class.join("mlx5_8")).unwrap();
        let second = c.collect(2).unwrap();
        let ports = batch(&second, &PORT);
        assert_eq!(ports.len(), 7);
        assert!((0..ports.len())
            .all(|r| !["mlx5_7", "mlx5_8"].contains(&tag(ports, "device", r).as_str())));
        let hw = batch(&second, &HW_COUNTER);
        assert!((0..hw.len()).all(|r| tag(hw, "device", r) != "mlx5_8"));
        // mlx5_7 still exists, without ports.
        assert_eq!(batch(&second, &DEVICE).len(), 8);
        // And it comes back.
        copy_tree(
            &fixture().join("sys/class/infiniband/mlx5_8"),
            &class.join("mlx5_8"),
        );
        assert_eq!(batch(&c.collect(3).unwrap(), &PORT).len(), 8);
    }

    #[test]
    fn a_port_vanishing_mid_walk_is_skipped() {
        // The walk is cached: remove a port without changing the device list,
        // so the next tick finds the cached files missing mid-read.
        let dir = fixture_copy();
        let mut c = collector(dir.path());
        c.collect(1).unwrap();
        let port = dir.path().join("sys/class/infiniband/mlx5_2/ports/1");
        std::fs::remove_dir_all(port.join("counters")).unwrap();
        std::fs::remove_dir_all(port.join("hw_counters")).unwrap();
        // The counters went but the port stayed: nulls.
        let batches = c.collect(2).unwrap();
        let ports = batch(&batches, &PORT);
        assert_eq!(ports.len(), 9);
        let r = row(ports, "mlx5_2", "1");
        assert_eq!(u64_at(ports, "xmit_data_bytes", r), None);
        assert_eq!(u64_at(ports, "state", r), Some(4));
        // Now the whole port goes, between a walk and a read.
        std::fs::remove_dir_all(&port).unwrap();
        c.stale = false;
        c.ticks = 1;
        let batches = c.collect(3).unwrap();
        assert_eq!(batch(&batches, &PORT).len(), 8);
        assert!(c.stale, "a vanished port asks for a new walk");
    }

    #[test]
    fn a_missing_optional_file_is_null() {
        let dir = fixture_copy();
        let port = dir.path().join("sys/class/infiniband/mlx5_0/ports/1");
        std::fs::remove_file(port.join("counters/port_xmit_wait")).unwrap();
        std::fs::remove_file(port.join("rate")).unwrap();
        std::fs::write(port.join("counters/VL15_dropped"), "N/A (no PMA)\n").unwrap();
        let batches = collector(dir.path()).collect(1).unwrap();
        let ports = batch(&batches, &PORT);
        let r = row(ports, "mlx5_0", "1");
        assert_eq!(u64_at(ports, "xmit_wait", r), None);
        assert_eq!(u64_at(ports, "vl15_dropped", r), None);
        assert_eq!(f64_at(ports, "rate_bytes_per_second", r), None);
        assert_eq!(u64_at(ports, "symbol_error", r), Some(0));
        let link = batch(&batches, &LINK);
        assert_eq!(tag(link, "rate", row(link, "mlx5_0", "1")), "");
    }

    /// Every tag and value of every row, keyed `table device/port/counter
    /// name`: what two reads of a tree can be compared by.
    fn cells(batches: &[Batch]) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for b in batches {
            for r in 0..b.len() {
                let ids: Vec<String> = ["device", "port", "counter"]
                    .iter()
                    .filter(|t| b.table.tag_index(t).is_some())
                    .map(|t| tag(b, t, r))
                    .collect();
                let id = format!("{} {}", b.table.name, ids.join("/"));
                for t in b.table.tags {
                    if !["device", "port", "counter"].contains(&t.name) {
                        out.insert(format!("{id} {}", t.name), tag(b, t.name, r));
                    }
                }
                for (i, field) in b.table.fields.iter().enumerate() {
                    let column = &b.fields[i];
                    let shown = if !column.is_valid(r) {
                        "null".to_string()
                    } else {
                        match &column.values {
                            Values::U64(v) => v[r].to_string(),
                            Values::F64(v) => v[r].to_string(),
                            Values::I64(v) => v[r].to_string(),
                        }
                    };
                    out.insert(format!("{id} {}", field.name), shown);
                }
            }
        }
        out
    }

    /// One file of one port or device holding what the kernel never writes
    /// (issue 36, item 6): the tick succeeds, that file's value alone is lost
    /// (a null, or an empty tag), every other port, counter and device reads
    /// as from the intact tree, and the file is named in `source_errors`.
    /// Mended, the next walk reads it with no error.
    #[test]
    fn a_bad_file_costs_only_its_own_value() {
        let intact = cells(&collector(fixture_copy().path()).collect(1).unwrap());
        for (rel, content, lost, reason) in [
            (
                "mlx5_1/ports/1/counters/symbol_error",
                "12x\n",
                &["infiniband_port mlx5_1/1 symbol_error"][..],
                "\"12x\" is not a counter",
            ),
            (
                "mlx5_1/ports/1/counters/port_rcv_data",
                "",
                &["infiniband_port mlx5_1/1 rcv_data_bytes"],
                "empty",
            ),
            (
                "mlx5_1/ports/1/counters/port_xmit_data",
                "18446744073709551616\n",
                &["infiniband_port mlx5_1/1 xmit_data_bytes"],
                "\"18446744073709551616\" overflows 64 bits",
            ),
            // Fits in 64 bits, but not once scaled to bytes.
            (
                "mlx5_1/ports/1/counters/port_rcv_data",
                "18446744073709551615\n",
                &["infiniband_port mlx5_1/1 rcv_data_bytes"],
                "18446744073709551615 times 4 overflows 64 bits",
            ),
            (
                "mlx5_1/ports/1/state",
                "4: ACTIV\n",
                &[
                    "infiniband_port mlx5_1/1 state",
                    "infiniband_link mlx5_1/1 state",
                ],
                "\"4: ACTIV\" is not a port state",
            ),
            (
                "mlx5_1/ports/1/phys_state",
                "5\n",
                &[
                    "infiniband_port mlx5_1/1 phys_state",
                    "infiniband_link mlx5_1/1 phys_state",
                ],
                "\"5\" is not a port state",
            ),
            (
                "mlx5_1/ports/1/rate",
                "fast\n",
                &[
                    "infiniband_port mlx5_1/1 rate_bytes_per_second",
                    "infiniband_link mlx5_1/1 rate",
                ],
                "\"fast\" is not a rate in Gb/sec",
            ),
            (
                "mlx5_1/ports/1/lid",
                "12\n",
                &["infiniband_link mlx5_1/1 lid"],
                "\"12\" is not a hex LID",
            ),
            (
                "mlx5_1/ports/1/link_layer",
                "Token Ring\n",
                &["infiniband_link mlx5_1/1 link_layer"],
                "unknown link layer \"Token Ring\"",
            ),
            (
                "mlx5_8/ports/1/hw_counters/np_cnp_sent",
                "lots\n",
                &["infiniband_hw mlx5_8/1/np_cnp_sent value"],
                "\"lots\" is not a counter",
            ),
            (
                "mlx5_8/ports/1/hw_counters/out_of_buffer",
                "\u{0}\u{0}\n",
                &["infiniband_hw mlx5_8/1/out_of_buffer value"],
                "\"\\0\\0\" is not a counter",
            ),
            (
                "mlx5_0/fw_ver",
                "\u{ff}\u{fe}\n",
                &["infiniband_device mlx5_0 fw_ver"],
                "not UTF-8 text",
            ),
        ] {
            let dir = fixture_copy();
            let path = dir.path().join("sys/class/infiniband").join(rel);
            if rel.ends_with("fw_ver") {
                std::fs::write(&path, b"\xff\xfe\n").unwrap();
            } else {
                std::fs::write(&path, content).unwrap();
            }
            let mut c = collector(dir.path());
            let damaged = cells(&c.collect(1).unwrap());
            assert_eq!(
                damaged.keys().collect::<Vec<_>>(),
                intact.keys().collect::<Vec<_>>(),
                "{rel}: every row is there"
            );
            let changed: Vec<&str> = intact
                .iter()
                .filter(|(k, v)| damaged[*k] != **v)
                .map(|(k, _)| k.as_str())
                .collect();
            let mut lost = lost.to_vec();
            lost.sort_unstable();
            assert_eq!(changed, lost, "{rel}");
            for key in &lost {
                assert!(
                    ["null", ""].contains(&damaged[*key].as_str()),
                    "{rel}: {key} = {}",
                    damaged[*key]
                );
            }
            let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
            assert_eq!(errors, [format!("{}: {reason}", path.display())], "{rel}");
            // A file read at the walk is named at every tick until mended.
            assert_eq!(c.collect(2).unwrap().len(), 4);
            assert_eq!(c.source_errors().len(), 1, "{rel}");
            assert!(matches!(c.probe(), Availability::Available(_)), "{rel}");
            // Mended: read again (the walk's files at the next walk) with no error.
            std::fs::copy(fixture().join("sys/class/infiniband").join(rel), &path).unwrap();
            c.stale = true;
            assert_eq!(cells(&c.collect(3).unwrap()), intact, "{rel}");
            assert!(c.source_errors().is_empty(), "{rel}");
        }
    }

    /// A device whose ports cannot be listed is left out; the others are read.
    #[test]
    fn a_device_that_cannot_be_listed_costs_only_itself() {
        let dir = fixture_copy();
        let ports = dir.path().join("sys/class/infiniband/mlx5_4/ports");
        std::fs::remove_dir_all(&ports).unwrap();
        std::fs::write(&ports, "not a directory\n").unwrap();
        let mut c = collector(dir.path());
        let batches = c.collect(1).unwrap();
        assert_eq!(batch(&batches, &PORT).len(), 8);
        assert_eq!(batch(&batches, &DEVICE).len(), 8);
        let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(&format!("{}: ", ports.display())),
            "{errors:?}"
        );
    }

    #[test]
    fn follows_device_symlinks() {
        // Real sysfs: class/infiniband/mlx5_0 -> ../../devices/pci.../infiniband/mlx5_0
        let dir = tempfile::tempdir().unwrap();
        let real = dir
            .path()
            .join("sys/devices/pci0000:00/0000:00:01.0/infiniband");
        copy_tree(
            &fixture().join("sys/class/infiniband/mlx5_8"),
            &real.join("mlx5_8"),
        );
        let class = dir.path().join("sys/class/infiniband");
        std::fs::create_dir_all(&class).unwrap();
        std::os::unix::fs::symlink(
            "../../devices/pci0000:00/0000:00:01.0/infiniband/mlx5_8",
            class.join("mlx5_8"),
        )
        .unwrap();
        let batches = collector(dir.path()).collect(1).unwrap();
        let ports = batch(&batches, &PORT);
        assert_eq!(ports.len(), 1);
        assert_eq!(
            u64_at(ports, "rcv_packets", 0),
            Some(2_810_394_821 + 8 * 7919)
        );
        assert_eq!(batch(&batches, &HW_COUNTER).len(), 29);
    }

    #[test]
    fn the_walk_is_redone_only_when_needed() {
        let dir = fixture_copy();
        let mut c = collector(dir.path());
        c.collect(1).unwrap();
        // A new counter file appears: not seen until a walk.
        let port = dir.path().join("sys/class/infiniband/mlx5_3/ports/1");
        std::fs::write(port.join("counters/port_xmit_wait"), "77\n").unwrap();
        let batches = c.collect(2).unwrap();
        let ports = batch(&batches, &PORT);
        assert_eq!(u64_at(ports, "xmit_wait", row(ports, "mlx5_3", "1")), None);
        // A device appearing is noticed at once, and rewalks the rest.
        copy_tree(
            &fixture().join("sys/class/infiniband/mlx5_8"),
            &dir.path().join("sys/class/infiniband/mlx5_9"),
        );
        let batches = c.collect(3).unwrap();
        let ports = batch(&batches, &PORT);
        assert_eq!(ports.len(), 10);
        assert_eq!(
            u64_at(ports, "xmit_wait", row(ports, "mlx5_3", "1")),
            Some(77)
        );
    }

    #[test]
    fn kept_files_give_fresh_values_and_descriptions_wait_for_a_walk() {
        let dir = fixture_copy();
        let mut c = collector(dir.path());
        c.collect(1).unwrap();
        let class = dir.path().join("sys/class/infiniband");
        let port = class.join("mlx5_1/ports/1");
        // Rewritten in place, as the kernel renders a counter anew on each read.
        std::fs::write(port.join("counters/symbol_error"), "13\n").unwrap();
        std::fs::write(port.join("state"), "1: DOWN\n").unwrap();
        std::fs::write(port.join("rate"), "200 Gb/sec (4X HDR)\n").unwrap();
        std::fs::write(port.join("hw_counters/out_of_buffer"), "99\n").unwrap();
        // What describes the port and the HCA is read at the walk only.
        std::fs::write(port.join("lid"), "0x2f\n").unwrap();
        std::fs::write(class.join("mlx5_1/fw_ver"), "99.0.1\n").unwrap();
        let batches = c.collect(2).unwrap();
        let ports = batch(&batches, &PORT);
        let r = row(ports, "mlx5_1", "1");
        assert_eq!(u64_at(ports, "symbol_error", r), Some(13));
        assert_eq!(u64_at(ports, "state", r), Some(1));
        assert_eq!(f64_at(ports, "rate_bytes_per_second", r), Some(25e9));
        let hw = batch(&batches, &HW_COUNTER);
        assert_eq!(hw_value(hw, "mlx5_1", "1", "out_of_buffer"), Some(99));
        let link = batch(&batches, &LINK);
        let r = row(link, "mlx5_1", "1");
        assert_eq!(tag(link, "state", r), "DOWN");
        assert_eq!(tag(link, "rate", r), "200 Gb/sec (4X HDR)");
        assert_eq!(tag(link, "lid", r), "0x1e");
        let devices = batch(&batches, &DEVICE);
        assert_eq!(tag(devices, "fw_ver", 1), "28.39.2048");
        // The periodic walk picks them up.
        c.ticks = RESCAN_TICKS;
        let batches = c.collect(3).unwrap();
        let link = batch(&batches, &LINK);
        assert_eq!(tag(link, "lid", row(link, "mlx5_1", "1")), "0x2f");
        assert_eq!(tag(batch(&batches, &DEVICE), "fw_ver", 1), "99.0.1");
        // A rate that goes unreadable leaves an empty tag, not the last text.
        std::fs::remove_file(port.join("rate")).unwrap();
        c.stale = true;
        let batches = c.collect(4).unwrap();
        let link = batch(&batches, &LINK);
        assert_eq!(tag(link, "rate", row(link, "mlx5_1", "1")), "");
    }

    #[test]
    fn a_port_deleted_under_its_kept_files_is_noticed_without_its_directory() {
        // Where the walk could not hold the port directory open, the kept
        // state file tells that the port was deleted.
        let dir = fixture_copy();
        let mut c = collector(dir.path());
        c.collect(1).unwrap();
        for device in &mut c.devices {
            for port in &mut device.ports {
                port.dir_file = None;
            }
        }
        let port = dir.path().join("sys/class/infiniband/mlx5_4/ports/1");
        std::fs::remove_dir_all(&port).unwrap();
        c.stale = false;
        let batches = c.collect(2).unwrap();
        let ports = batch(&batches, &PORT);
        assert_eq!(ports.len(), 8);
        assert!((0..ports.len()).all(|r| tag(ports, "device", r) != "mlx5_4"));
        assert!(c.stale, "a vanished port asks for a new walk");
    }

    /// Timing of one collect over the fixture tree:
    /// `cargo test -p vtax collectors::infiniband::tests::timing -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing measurement, not a test: cargo test --release -p vtax infiniband::tests::timing -- --ignored --nocapture"]
    fn timing() {
        let mut c = collector(&fixture());
        c.collect(0).unwrap();
        let n = 2000;
        let start = std::time::Instant::now();
        for i in 0..n {
            std::hint::black_box(c.collect(i).unwrap());
        }
        let per = start.elapsed() / n as u32;
        let kept: usize = c
            .devices
            .iter()
            .map(|d| {
                d.hw.len()
                    + d.ports
                        .iter()
                        .map(|p| 3 + p.counters.len() + p.hw.len())
                        .sum::<usize>()
            })
            .sum();
        eprintln!(
            "one collect over 9 ports (fixture, {kept} files re-read, a walk every {RESCAN_TICKS} ticks): {per:?}"
        );
    }
}
