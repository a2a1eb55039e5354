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

mod discovery;
mod read;
mod collector;

use discovery::*;
pub use read::*;
pub use collector::*;

#[cfg(test)]
mod tests;

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

crate::common_settings!(InfinibandConfig);

impl crate::Registered for InfinibandConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn build(
        &self,
        _all: &crate::CollectorsConfig,
        roots: &crate::Roots,
    ) -> Box<dyn crate::Collector> {
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
        help: "One row per InfiniBand or RoCE port per tick: link state, rate and the PMA port counters from /sys/class/infiniband/<device>/ports/<port>/. Counters the driver lacks are null. The 16-bit and smaller error counters, and port_xmit_wait at 32 bits, stop at their maximum instead of wrapping. On a RoCE port (link_layer Ethernet) mlx5 fills the error counters and port_xmit_wait from the adapter's InfiniBand counter group, which may not count the Ethernet link: its congestion and loss show in infiniband_hw (np_cnp_sent, rp_cnp_handled, out_of_sequence, packet_seq_err).",
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
/// replace one that counts. Once taken it stays the source (across walks),
/// and a tick it does not read leaves the counter null, never the stopped
/// 32-bit value: that value between two 64-bit ones reads as a reset, and
/// `increase()` counts the whole 64-bit count again as traffic.
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
        help: "One row per driver-specific counter per tick, from hw_counters/ of a port (or of the device, port empty); names vary by driver (mlx5: out_of_buffer, out_of_sequence, np_cnp_sent, rp_cnp_handled, roce_adp_retrans, ...). The lifespan setting is not a counter and is left out, and so are the current values some drivers list beside their counters (bnxt_re's active_* and watermark_*, *_register).",
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
