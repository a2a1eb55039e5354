//! `netdev`: Ethernet and RoCE interfaces from `<sysfs>/class/net/<if>/`:
//! byte, packet, error and drop counters (`statistics/`), carrier changes,
//! speed, MTU and operstate, and where the interface's PCI function sits
//! (address, NUMA node) with its driver.
//!
//! Interfaces without a `device` link (loopback, bridges, veth, bonds, tunnels,
//! ifb) are virtual: their traffic is counted again on a physical port, so they
//! are skipped unless `virtual_interfaces` is on. The listing of `class/net` is
//! read every tick and the walk redone when it changes (or once a minute of
//! ticks); the per-tick files stay open ([`KeptFile`]). A `speed` the driver
//! refuses (EINVAL on a link that is down) or reports as -1 is null; a file that
//! holds what the kernel never writes fails the tick naming it.

use std::io;
use std::path::PathBuf;

use anyhow::anyhow;
use regex::RegexSet;
use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

use super::block::exclude_regex;
use super::kept::{is_gone, KeptFile};
use super::pci::{info_field, placement, NUMA_NODE_TAG, PCI_ADDRESS_TAG};
use super::{Availability, Collector, ParseError, Roots};

/// `[collectors.netdev]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetdevConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
    /// Whether interfaces without a `device` link get rows too.
    pub virtual_interfaces: bool,
    /// Interfaces whose name matches are skipped.
    pub interface_exclude: String,
}

impl Default for NetdevConfig {
    fn default() -> Self {
        NetdevConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            virtual_interfaces: false,
            interface_exclude: String::new(),
        }
    }
}

crate::common_settings!(NetdevConfig);

impl crate::Registered for NetdevConfig {
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
        Box::new(Netdev::new(self, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        self.validate()
    }
}

impl NetdevConfig {
    /// Checks the pattern; on failure the dotted key and the message.
    pub fn validate(&self) -> Result<(), (String, String)> {
        exclude_regex(
            &self.interface_exclude,
            "collectors.netdev.interface_exclude",
        )
        .map(|_| ())
    }
}

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[
    (
        "virtual_interfaces",
        "Also read interfaces without a device link under /sys/class/net (lo, bridges, veth, bonds, tunnels); their traffic is counted again on a physical port.",
    ),
    (
        "interface_exclude",
        "Skip interfaces whose name matches this regular expression (empty skips none).",
    ),
];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&NETDEV, &NETDEV_LINK];

const fn counter(name: &'static str, unit: Unit, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, unit, help)
}

const INTERFACE_TAG: TagDef = TagDef {
    name: "interface",
    help: "Interface name under /sys/class/net (eth0, ens1f0np0).",
};

vtax_store::table! {
    /// Counters and link numbers of one interface.
    pub static NETDEV: TableDef, pub struct NetdevRow {
        name: "netdev",
        help: "One row per network interface per tick, from /sys/class/net/<interface>/: traffic \
               counters (statistics/), carrier changes, speed, MTU and whether it is up. Values the \
               driver does not give are null. RDMA traffic of a RoCE port bypasses the kernel's \
               stack and is not counted here: it is in infiniband_port.",
        tags: [interface = INTERFACE_TAG],
        fields: [
            rx_bytes: Option<u64> = counter(Unit::Bytes, "Bytes received."),
            tx_bytes: Option<u64> = counter(Unit::Bytes, "Bytes sent."),
            rx_packets: Option<u64> = counter(Unit::None, "Packets received."),
            tx_packets: Option<u64> = counter(Unit::None, "Packets sent."),
            rx_errors: Option<u64> = counter(Unit::None, "Receive errors (bad CRC, length, frame, FIFO overrun)."),
            tx_errors: Option<u64> = counter(Unit::None, "Transmit errors."),
            rx_dropped: Option<u64> = counter(
                Unit::None,
                "Received packets dropped by the kernel or driver (no buffer, unknown protocol).",
            ),
            tx_dropped: Option<u64> = counter(Unit::None, "Packets dropped before transmission."),
            rx_missed_errors: Option<u64> = counter(
                Unit::None,
                "Packets the NIC dropped for lack of receive buffers: the host did not keep up.",
            ),
            carrier_changes: Option<u64> = counter(
                Unit::None,
                "Times the link went up or down (a flapping link counts fast).",
            ),
            speed_bytes_per_second: Option<f64> = FieldDef::gauge(
                FieldType::F64,
                Unit::BytesPerSecond,
                "Negotiated link speed (sysfs gives Mb/s); null when the link is down or the driver does not say (virtio).",
            ),
            mtu_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Maximum transmission unit."),
            up: Option<u64> = FieldDef::gauge(
                FieldType::U64,
                Unit::None,
                "1 when operstate is up, else 0 (the text is in netdev_link).",
            ),
        ],
        exported: true,
    }
}

/// The [`NetdevRow`] field a counter file fills.
type CounterField = for<'r, 'a> fn(&'r mut NetdevRow<'a>) -> &'r mut Option<u64>;

/// Counter files under the interface directory, read every tick, each with
/// the field it fills (speed, MTU and operstate are parsed apart).
const COUNTER_FILES: [(&str, CounterField); 10] = [
    ("statistics/rx_bytes", |r| &mut r.rx_bytes),
    ("statistics/tx_bytes", |r| &mut r.tx_bytes),
    ("statistics/rx_packets", |r| &mut r.rx_packets),
    ("statistics/tx_packets", |r| &mut r.tx_packets),
    ("statistics/rx_errors", |r| &mut r.rx_errors),
    ("statistics/tx_errors", |r| &mut r.tx_errors),
    ("statistics/rx_dropped", |r| &mut r.rx_dropped),
    ("statistics/tx_dropped", |r| &mut r.tx_dropped),
    ("statistics/rx_missed_errors", |r| &mut r.rx_missed_errors),
    ("carrier_changes", |r| &mut r.carrier_changes),
];

vtax_store::table! {
    /// The text attributes of an interface, as tags of an info row.
    pub static NETDEV_LINK: TableDef, pub struct NetdevLinkRow {
        name: "netdev_link",
        help: "One row per network interface per tick whose tags describe it: operstate, driver and \
               where it sits in the PCI tree; join on interface.",
        tags: [
            interface = INTERFACE_TAG,
            operstate = TagDef {
                name: "operstate",
                help: "RFC 2863 state as the kernel writes it: up, down, lowerlayerdown, dormant, testing, notpresent, unknown.",
            },
            driver = TagDef {
                name: "driver",
                help: "Kernel driver of the interface's device (mlx5_core, virtio_net, ice); empty when virtual.",
            },
            pci_address = PCI_ADDRESS_TAG,
            numa_node = NUMA_NODE_TAG,
        ],
        fields: [info: u64 = info_field()],
        exported: true,
    }
}

/// Ticks between two walks when nothing asked for one sooner.
const RESCAN_TICKS: u64 = 60;

/// The operstates the kernel writes (`operstates[]` in net-sysfs.c).
const OPERSTATES: &[&str] = &[
    "unknown",
    "notpresent",
    "down",
    "lowerlayerdown",
    "testing",
    "dormant",
    "up",
];

/// An interface as the last walk found it.
#[derive(Debug)]
struct Interface {
    name: String,
    dir: PathBuf,
    driver: String,
    pci_address: String,
    numa_node: String,
    counters: Vec<(KeptFile, CounterField)>,
    speed: KeptFile,
    mtu: KeptFile,
    operstate: KeptFile,
}

/// The netdev collector.
pub struct Netdev {
    class_dir: PathBuf,
    virtual_interfaces: bool,
    exclude: Option<RegexSet>,
    /// Each interface's name and its sysfs entry's inode, as last listed:
    /// the inode moves with the device when interfaces swap names (udev's
    /// renames, a bond's failover), which a list of names alone misses.
    listed: Option<Vec<(String, u64)>>,
    interfaces: Vec<Interface>,
    stale: bool,
    ticks: u64,
    buf: Vec<u8>,
    rows: BatchBuilder,
    link_rows: BatchBuilder,
    /// `name operstate` of the interfaces with rows at the last tick, for `probe`.
    seen: Vec<String>,
    /// Interfaces skipped as virtual at the last walk.
    skipped_virtual: usize,
    problems: Vec<String>,
    /// Files that read badly at the last tick: each costs only its own
    /// field (or an interface's operstate), not the interface's row or the
    /// other interfaces'.
    errors: Vec<ParseError>,
}

/// How a read of a kept file went.
enum Read<'a> {
    Text(&'a str),
    /// ENOENT or ENODEV: the file, or its interface, is not there.
    Gone,
    /// The driver refused (EINVAL on `speed` of a link that is down).
    Refused(io::Error),
}

/// `file` holds what the kernel never writes there.
fn bad(file: &KeptFile, reason: String) -> ParseError {
    ParseError {
        path: file.path().display().to_string(),
        line: 0,
        reason,
    }
}

fn read<'b>(file: &mut KeptFile, buf: &'b mut Vec<u8>) -> Result<Read<'b>, ParseError> {
    match file.read(buf) {
        Ok(len) => std::str::from_utf8(&buf[..len])
            .map(Read::Text)
            .map_err(|_| bad(file, "not UTF-8 text".into())),
        Err(e) if is_gone(&e) => Ok(Read::Gone),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(bad(file, e.to_string())),
        Err(e) => Ok(Read::Refused(e)),
    }
}

/// A decimal number and a newline, as sysfs writes one.
fn parse_u64(text: &str, file: &KeptFile) -> Result<u64, ParseError> {
    let t = text.strip_suffix('\n').unwrap_or(text);
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(file, format!("{t:?} is not a number")));
    }
    t.parse()
        .map_err(|_| bad(file, format!("{t:?} overflows 64 bits")))
}

impl Netdev {
    /// A netdev collector reading under `roots`.
    pub fn new(config: &NetdevConfig, roots: &Roots) -> Self {
        Netdev {
            class_dir: roots.sys("class/net"),
            virtual_interfaces: config.virtual_interfaces,
            exclude: exclude_regex(&config.interface_exclude, "").ok().flatten(),
            listed: None,
            interfaces: Vec::new(),
            stale: true,
            ticks: 0,
            buf: Vec::new(),
            rows: BatchBuilder::new(&NETDEV),
            link_rows: BatchBuilder::new(&NETDEV_LINK),
            seen: Vec::new(),
            skipped_virtual: 0,
            problems: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn list(&self) -> anyhow::Result<Option<Vec<(String, u64)>>> {
        let entries = match std::fs::read_dir(&self.class_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(anyhow!("{}: {e}", self.class_dir.display())),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| anyhow!("{}: {e}", self.class_dir.display()))?;
            if let Ok(name) = entry.file_name().into_string() {
                use std::os::unix::fs::DirEntryExt;
                names.push((name, entry.ino()));
            }
        }
        names.sort();
        Ok(Some(names))
    }

    fn refresh(&mut self) -> anyhow::Result<()> {
        let listing = match self.list() {
            Ok(listing) => listing,
            Err(e) => {
                // Out of descriptors, the listing itself fails. The files of
                // the interfaces held are let go (13 an interface): kept, a
                // node out of descriptors stayed so after its interfaces
                // went, the web server unable to accept a scrape that would
                // have told of it.
                self.interfaces.clear();
                self.stale = true;
                return Err(e);
            }
        };
        if listing == self.listed && !self.stale && !self.ticks.is_multiple_of(RESCAN_TICKS) {
            return Ok(());
        }
        self.interfaces.clear();
        self.skipped_virtual = 0;
        for (name, _) in listing.iter().flatten() {
            if self.exclude.as_ref().is_some_and(|r| r.is_match(name)) {
                continue;
            }
            let dir = self.class_dir.join(name);
            let device = dir.join("device");
            // `exists` follows the link: a dangling one is no device either.
            let is_virtual = !device.exists();
            if is_virtual && !self.virtual_interfaces {
                self.skipped_virtual += 1;
                continue;
            }
            if !dir.join("statistics").is_dir() {
                continue; // not an interface (a stray file), or going away
            }
            let driver = std::fs::read_link(device.join("driver"))
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_default();
            // Through the device link, which any tree has, not through the
            // interface's own directory, which only the kernel's makes a
            // link into the device's.
            let place = if is_virtual {
                Default::default()
            } else {
                placement(&device)
            };
            self.interfaces.push(Interface {
                counters: COUNTER_FILES
                    .iter()
                    .map(|(rel, field)| (KeptFile::new(dir.join(rel)), *field))
                    .collect(),
                speed: KeptFile::new(dir.join("speed")),
                mtu: KeptFile::new(dir.join("mtu")),
                operstate: KeptFile::new(dir.join("operstate")),
                name: name.clone(),
                dir,
                driver,
                pci_address: place.pci_address,
                numa_node: place.numa_node,
            });
        }
        self.listed = listing;
        self.stale = false;
        Ok(())
    }

    fn read_all(&mut self, time_us: i64) -> anyhow::Result<()> {
        let Netdev {
            interfaces,
            buf,
            rows,
            link_rows,
            seen,
            problems,
            errors,
            stale,
            ..
        } = self;
        'interfaces: for iface in interfaces.iter_mut() {
            let mut row = NetdevRow {
                interface: &iface.name,
                ..NetdevRow::default()
            };
            macro_rules! text {
                ($file:expr, $report_refusal:expr) => {
                    match read($file, buf) {
                        Err(e) => {
                            errors.push(e);
                            None
                        }
                        Ok(Read::Text(t)) => Some(t),
                        Ok(Read::Gone) => {
                            *stale = true;
                            if !iface.dir.join("statistics").is_dir() {
                                continue 'interfaces; // the interface went away
                            }
                            None
                        }
                        Ok(Read::Refused(e)) => {
                            if $report_refusal {
                                problems.push(format!("{}: {e}", $file.path().display()));
                            }
                            None
                        }
                    }
                };
            }
            // A file that reads badly costs its own field only.
            macro_rules! number {
                ($text:expr, $file:expr) => {
                    match parse_u64($text, $file) {
                        Ok(n) => Some(n),
                        Err(e) => {
                            errors.push(e);
                            None
                        }
                    }
                };
            }
            for (file, field) in iface.counters.iter_mut() {
                if let Some(t) = text!(file, true) {
                    if let Some(n) = number!(t, file) {
                        *field(&mut row) = Some(n);
                    }
                }
            }
            // A link that is down refuses `speed` (EINVAL): no problem, a null.
            if let Some(t) = text!(&mut iface.speed, false) {
                let s = t.trim_end();
                // -1 (SPEED_UNKNOWN) from drivers that do not know, virtio's case.
                if s != "-1" {
                    if let Some(mbits) = number!(t, &iface.speed) {
                        row.speed_bytes_per_second = Some(mbits as f64 * 1e6 / 8.0);
                    }
                }
            }
            if let Some(t) = text!(&mut iface.mtu, true) {
                if let Some(n) = number!(t, &iface.mtu) {
                    row.mtu_bytes = Some(n);
                }
            }
            let mut operstate = "";
            if let Some(t) = text!(&mut iface.operstate, true) {
                let s = t.trim_end_matches('\n');
                match OPERSTATES.iter().find(|o| **o == s) {
                    Some(state) => {
                        operstate = state;
                        row.up = Some(u64::from(operstate == "up"));
                    }
                    None => {
                        errors.push(bad(&iface.operstate, format!("{s:?} is not an operstate")))
                    }
                }
            }
            rows.push_row(time_us, &row)?;
            let link = NetdevLinkRow {
                interface: &iface.name,
                operstate,
                driver: &iface.driver,
                pci_address: &iface.pci_address,
                numa_node: &iface.numa_node,
                info: 1,
            };
            link_rows.push_row(time_us, &link)?;
            if !iface.driver.is_empty() && operstate == "down" {
                problems.push(format!(
                    "{} is down: no link (cable, transceiver, switch port)",
                    iface.name
                ));
            }
            seen.push(format!("{} {operstate}", iface.name));
        }
        Ok(())
    }
}

impl Collector for Netdev {
    fn name(&self) -> &'static str {
        "netdev"
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.errors.clone()
    }

    fn probe(&mut self) -> Availability {
        self.stale = true;
        if let Err(e) = self.collect(0) {
            // No class/net lists as none below; an error here is a source
            // that reads badly, probed again until it mends.
            return Availability::Failed(format!("{e:#}"));
        }
        let dir = self.class_dir.display();
        if self.listed.is_none() {
            return Availability::Absent(format!("no {dir}"));
        }
        if self.seen.is_empty() {
            return Availability::Absent(format!(
                "no physical interface under {dir} ({} virtual skipped; collectors.netdev.virtual_interfaces reads them)",
                self.skipped_virtual
            ));
        }
        Availability::Available(format!(
            "{} interface{}: {}",
            self.seen.len(),
            if self.seen.len() == 1 { "" } else { "s" },
            self.seen.join(", ")
        ))
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        self.seen.clear();
        self.problems.clear();
        self.errors.clear();
        let result = self.refresh().and_then(|()| self.read_all(time_us));
        self.ticks = self.ticks.wrapping_add(1);
        let batches = [self.rows.finish(), self.link_rows.finish()];
        result?;
        Ok(batches.into_iter().filter(|b| !b.is_empty()).collect())
    }

    fn problems(&self) -> Vec<String> {
        self.problems.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{copy_tree, f64s, node, roots, tags, u64s};

    /// A copy of a fixture's sys tree, symlinks kept.
    fn copy_of(name: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&node(name).join("sys"), &dir.path().join("sys"));
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        dir
    }

    #[test]
    fn tables_are_valid() {
        for table in TABLES {
            table.validate().unwrap();
        }
        // Each counter file fills the field of its own name.
        for (file, field) in COUNTER_FILES {
            let mut row = NetdevRow::default();
            *field(&mut row) = Some(1);
            let mut rows = BatchBuilder::new(&NETDEV);
            rows.push_row(0, &row).unwrap();
            let batch = rows.finish();
            let filled: Vec<&str> = NETDEV
                .fields
                .iter()
                .zip(&batch.fields)
                .filter(|(_, column)| column.is_valid(0))
                .map(|(def, _)| def.name)
                .collect();
            assert_eq!(filled.len(), 1, "{file} fills {filled:?}");
            assert!(file.ends_with(filled[0]), "{file} feeds {}", filled[0]);
        }
    }

    #[test]
    fn vm_node_reads_eth0_and_skips_virtual_interfaces() {
        let mut c = Netdev::new(&NetdevConfig::default(), &roots(&node("vm-node")));
        match c.probe() {
            Availability::Available(s) => assert_eq!(s, "1 interface: eth0 up"),
            other => panic!("{other:?}"),
        }
        let batches = c.collect(3).unwrap();
        let (rows, link) = (&batches[0], &batches[1]);
        assert_eq!(tags(rows, "interface"), ["eth0"]);
        let captured = |file: &str| {
            std::fs::read_to_string(node("vm-node").join("sys/class/net/eth0").join(file))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        };
        assert_eq!(
            u64s(rows, "rx_bytes"),
            [Some(captured("statistics/rx_bytes"))]
        );
        assert_eq!(
            u64s(rows, "tx_packets"),
            [Some(captured("statistics/tx_packets"))]
        );
        assert_eq!(u64s(rows, "carrier_changes"), [Some(2)]);
        assert_eq!(u64s(rows, "mtu_bytes"), [Some(1400)]);
        assert_eq!(
            f64s(rows, "speed_bytes_per_second"),
            [None],
            "virtio says -1"
        );
        assert_eq!(u64s(rows, "up"), [Some(1)]);
        assert_eq!(tags(link, "driver"), ["virtio_net"]);
        assert_eq!(tags(link, "pci_address"), ["0000:00:03.0"]);
        assert_eq!(tags(link, "numa_node"), [""]);
        assert!(c.problems().is_empty());

        let config = NetdevConfig {
            virtual_interfaces: true,
            interface_exclude: "^ifb".into(),
            ..NetdevConfig::default()
        };
        let batches = Netdev::new(&config, &roots(&node("vm-node")))
            .collect(3)
            .unwrap();
        assert_eq!(tags(&batches[0], "interface"), ["eth0", "lo"]);
        // lo refuses `speed` (EINVAL in the capture is an absent file here).
        assert_eq!(f64s(&batches[0], "speed_bytes_per_second"), [None, None]);
        assert_eq!(tags(&batches[1], "operstate"), ["up", "unknown"]);
    }

    #[test]
    fn baremetal_node_has_roce_and_ethernet_ports_on_their_numa_nodes() {
        let mut c = Netdev::new(&NetdevConfig::default(), &roots(&node("baremetal-node")));
        let batches = c.collect(3).unwrap();
        let (rows, link) = (&batches[0], &batches[1]);
        assert_eq!(tags(rows, "interface"), ["eno1", "eno2", "ens22f0np0"]);
        assert_eq!(tags(link, "driver"), ["ixgbe", "ixgbe", "mlx5_core"]);
        assert_eq!(tags(link, "numa_node"), ["0", "0", "1"]);
        assert_eq!(tags(link, "pci_address")[2], "0000:c6:00.0");
        assert_eq!(tags(link, "operstate"), ["up", "down", "up"]);
        assert_eq!(
            f64s(rows, "speed_bytes_per_second"),
            [Some(1.25e9), None, Some(12.5e9)]
        );
        assert_eq!(u64s(rows, "mtu_bytes")[2], Some(9000));
        assert_eq!(u64s(rows, "rx_dropped")[2], Some(1844));
        assert_eq!(
            c.problems(),
            ["eno2 is down: no link (cable, transceiver, switch port)"]
        );
    }

    /// A file that holds what the kernel never writes costs its own field
    /// (or the operstate) and is named; the interface keeps its row.
    #[test]
    fn garbage_names_the_file_and_costs_only_its_field() {
        for (rel, content, want) in [
            ("statistics/rx_bytes", "12x\n", "\"12x\" is not a number"),
            ("statistics/tx_dropped", "", "\"\" is not a number"),
            (
                "statistics/rx_packets",
                "18446744073709551616\n",
                "\"18446744073709551616\" overflows 64 bits",
            ),
            ("mtu", "-5\n", "\"-5\" is not a number"),
            ("speed", "fast\n", "\"fast\" is not a number"),
            (
                "operstate",
                "sideways\n",
                "\"sideways\" is not an operstate",
            ),
        ] {
            let dir = copy_of("vm-node");
            let iface = std::fs::canonicalize(dir.path().join("sys/class/net/eth0")).unwrap();
            let path = iface.join(rel);
            let good = std::fs::read(&path).unwrap();
            std::fs::write(&path, content).unwrap();
            let mut c = Netdev::new(&NetdevConfig::default(), &roots(dir.path()));
            let batches = c.collect(1).unwrap();
            assert_eq!(batches[0].len(), 1, "the interface keeps its row: {rel}");
            assert_eq!(
                u64s(&batches[0], "tx_packets")[0].is_some(),
                !rel.ends_with("tx_packets")
            );
            let named = dir.path().join("sys/class/net/eth0").join(rel);
            let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
            assert_eq!(errors, [format!("{}: {want}", named.display())], "{rel}");
            std::fs::write(&path, good).unwrap();
            assert_eq!(c.collect(2).unwrap()[0].len(), 1, "recovers: {rel}");
            assert!(c.source_errors().is_empty(), "mended: {rel}");
        }
        let dir = copy_of("vm-node");
        let path = dir.path().join("sys/class/net/eth0/operstate");
        std::fs::write(&path, b"\xff\n").unwrap();
        let mut c = Netdev::new(&NetdevConfig::default(), &roots(dir.path()));
        assert_eq!(c.collect(1).unwrap()[0].len(), 1);
        let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
        assert_eq!(errors, [format!("{}: not UTF-8 text", path.display())]);
    }

    /// A listing that fails (the process out of descriptors, or here a
    /// class directory that cannot be read) lets go of the files held open
    /// for the interfaces: kept, they held the process out of descriptors
    /// after the interfaces were gone.
    #[test]
    fn a_failed_listing_lets_go_of_the_files_held() {
        let dir = copy_of("baremetal-node");
        let mut c = Netdev::new(&NetdevConfig::default(), &roots(dir.path()));
        assert_eq!(c.collect(1).unwrap()[0].len(), 3);
        assert_eq!(c.interfaces.len(), 3);
        let class = dir.path().join("sys/class/net");
        let aside = dir.path().join("net-aside");
        std::fs::rename(&class, &aside).unwrap();
        std::fs::write(&class, b"not a directory").unwrap();
        c.ticks = 1;
        assert!(c.collect(2).is_err());
        assert!(c.interfaces.is_empty(), "the kept files are let go");
        std::fs::remove_file(&class).unwrap();
        std::fs::rename(&aside, &class).unwrap();
        assert_eq!(c.collect(3).unwrap()[0].len(), 3, "read again once it lists");
    }

    /// Two interfaces that swap names between walks (udev renaming, a
    /// bond's failover) keep no name in or out of the listing: the
    /// descriptors held followed the devices, so each name read the other's
    /// counters until the next walk, up to a minute later. The entries'
    /// inodes move with the devices, in sysfs as in this fixture's links.
    #[test]
    fn interfaces_that_swap_names_are_read_under_their_new_names() {
        let dir = copy_of("baremetal-node");
        let mut c = Netdev::new(&NetdevConfig::default(), &roots(dir.path()));
        let read = |c: &mut Netdev, time: i64| {
            let batches = c.collect(time).unwrap();
            tags(&batches[0], "interface")
                .into_iter()
                .zip(u64s(&batches[0], "rx_bytes"))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let before = read(&mut c, 1);
        assert_ne!(before["eno1"], before["eno2"], "the fixture tells them apart");
        let class = dir.path().join("sys/class/net");
        std::fs::rename(class.join("eno1"), class.join("swap")).unwrap();
        std::fs::rename(class.join("eno2"), class.join("eno1")).unwrap();
        std::fs::rename(class.join("swap"), class.join("eno2")).unwrap();
        // Between two walks, with nothing asking for one sooner (this
        // fixture lacks a file, which asks for a walk every tick).
        c.ticks = 1;
        c.stale = false;
        let after = read(&mut c, 2);
        assert_eq!(after["eno1"], before["eno2"]);
        assert_eq!(after["eno2"], before["eno1"]);
    }

    #[test]
    fn interfaces_coming_and_going() {
        let dir = copy_of("baremetal-node");
        let mut c = Netdev::new(&NetdevConfig::default(), &roots(dir.path()));
        assert_eq!(c.collect(1).unwrap()[0].len(), 3);
        let link = dir.path().join("sys/class/net/ens22f0np0");
        let target = std::fs::canonicalize(&link).unwrap();
        // Unplugged between a walk and a read: its files vanish, its link stays.
        let moved = dir.path().join("moved");
        std::fs::rename(&target, &moved).unwrap();
        assert!(!link.join("statistics").is_dir());
        c.ticks = 1;
        let batches = c.collect(2).unwrap();
        assert_eq!(tags(&batches[0], "interface"), ["eno1", "eno2"]);
        assert!(c.stale, "a vanished interface asks for a new walk");
        // Back, and noticed at the walk the stale flag asked for.
        std::fs::rename(&moved, &target).unwrap();
        assert_eq!(c.collect(3).unwrap()[0].len(), 3);
        // A file that goes (a driver without rx_missed_errors) is a null.
        std::fs::remove_file(target.join("statistics/rx_missed_errors")).unwrap();
        let batches = c.collect(4).unwrap();
        assert_eq!(u64s(&batches[0], "rx_missed_errors")[2], None);
        assert!(u64s(&batches[0], "rx_bytes")[2].is_some());
        // No class/net at all: absent, not an error.
        std::fs::remove_dir_all(dir.path().join("sys/class/net")).unwrap();
        let Availability::Absent(why) = c.probe() else {
            panic!("absent without class/net")
        };
        assert!(why.starts_with("no "), "{why}");
    }

    #[test]
    fn config_keys() {
        let config: NetdevConfig =
            toml::from_str("virtual_interfaces = true\ninterface_exclude = \"^veth\"\n").unwrap();
        assert!(config.virtual_interfaces);
        config.validate().unwrap();
        assert!(toml::from_str::<NetdevConfig>("virtual = true\n").is_err());
        let bad = NetdevConfig {
            interface_exclude: "[".into(),
            ..NetdevConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().0,
            "collectors.netdev.interface_exclude"
        );
        for key in ["virtual_interfaces", "interface_exclude"] {
            assert!(KEY_DOCS.iter().any(|(k, _)| *k == key), "{key}");
        }
    }
}
