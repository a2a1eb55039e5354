//! `block`: block devices from `<procfs>/diskstats` (every counter, one
//! `pread` a tick for all devices) and `<sysfs>/block/<dev>/` (which devices
//! are whole disks, their model, whether NVMe, and the NUMA node of the PCI
//! function they hang off).
//!
//! What describes a device is read when a name first appears in diskstats and
//! again once a minute of ticks; the counters are read every tick. Sectors in
//! diskstats are 512 bytes whatever the device's block size, and times are
//! milliseconds: both become base units (bytes, seconds) here.
//!
//! Lines of 11 (Linux < 4.18), 15 (< 5.5) or 17 fields are read; fields an older
//! kernel lacks (discards, flushes) are null. A line that is short, holds a
//! non-number or overflows fails the tick with the file and line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::anyhow;
use regex::RegexSet;
use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

use super::kept::KeptFile;
use super::pci::{info_field, placement, NUMA_NODE_TAG, PCI_ADDRESS_TAG};
use super::{Availability, Collector, ParseError, Roots};

/// Devices skipped by default: loop devices and RAM disks hold no data that
/// training reads or writes, and a node can have hundreds of loop devices.
pub const DEFAULT_DEVICE_EXCLUDE: &str = r"^(loop|ram|zram)\d+$";

/// `[collectors.block]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BlockConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
    /// Whether partitions get rows of their own.
    pub partitions: bool,
    /// Devices whose name matches are skipped.
    pub device_exclude: String,
}

impl Default for BlockConfig {
    fn default() -> Self {
        BlockConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            partitions: false,
            device_exclude: DEFAULT_DEVICE_EXCLUDE.into(),
        }
    }
}

crate::common_settings!(BlockConfig);

impl crate::Registered for BlockConfig {
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
        Box::new(Block::new(self, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        self.validate()
    }
}

impl BlockConfig {
    /// Checks the pattern; on failure the dotted key and the message.
    pub fn validate(&self) -> Result<(), (String, String)> {
        exclude_regex(&self.device_exclude, "collectors.block.device_exclude").map(|_| ())
    }
}

/// Compiles an exclusion pattern (empty excludes nothing); the error names `key`.
pub fn exclude_regex(pattern: &str, key: &str) -> Result<Option<RegexSet>, (String, String)> {
    if pattern.is_empty() {
        return Ok(None);
    }
    super::cgroups::compile(key, &[pattern.to_owned()])
        .map(Some)
        .map_err(|message| (key.to_owned(), message))
}

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[
    (
        "partitions",
        "Also give every partition (sda1, nvme0n1p2) rows of its own; off, a partition's I/O is already in its disk's.",
    ),
    (
        "device_exclude",
        "Skip devices whose name matches this regular expression (empty skips none); the default skips loop devices and RAM disks.",
    ),
];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&BLOCK, &BLOCK_DEVICE];

const fn ops(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::None, help)
}

const fn bytes(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::Bytes, help)
}

const fn seconds(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::F64, Unit::Seconds, help)
}

const DEVICE_TAG: TagDef = TagDef {
    name: "device",
    help: "Block device name as in /proc/diskstats (nvme0n1, sda, vda, dm-0, md0).",
};

vtax_store::table! {
    /// The counters of one device.
    pub static BLOCK: TableDef, pub struct BlockRow {
        name: "block",
        help: "One row per block device per tick, from /proc/diskstats: operations, bytes and time \
               for reads, writes, discards and flushes (average latency of an operation is time over \
               operations: one PromQL division of two rates). Fields an older kernel lacks are null.",
        tags: [device = DEVICE_TAG],
        fields: [
            reads_completed: Option<u64> = ops("Reads completed."),
            reads_merged: Option<u64> = ops("Adjacent reads merged into one before reaching the device."),
            read_bytes: Option<u64> = bytes("Bytes read (512-byte sectors times 512)."),
            read_time_seconds: Option<f64> = seconds(
                "Time reads spent from issue to completion, summed over all reads (overlapping reads each count).",
            ),
            writes_completed: Option<u64> = ops("Writes completed."),
            writes_merged: Option<u64> = ops("Adjacent writes merged into one before reaching the device."),
            written_bytes: Option<u64> = bytes("Bytes written (512-byte sectors times 512)."),
            write_time_seconds: Option<f64> = seconds(
                "Time writes spent from issue to completion, summed over all writes.",
            ),
            in_flight: Option<u64> = FieldDef::gauge(
                FieldType::U64,
                Unit::None,
                "Requests issued to the driver and not yet completed.",
            ),
            io_time_seconds: Option<f64> = seconds(
                "Time the device had at least one request in flight (io_ticks): its rate is the utilisation.",
            ),
            io_weighted_time_seconds: Option<f64> = seconds(
                "Time in flight weighted by the requests in flight (time_in_queue): its rate is the average queue depth.",
            ),
            discards_completed: Option<u64> = ops("Discards (TRIM) completed; null before Linux 4.18."),
            discards_merged: Option<u64> = ops("Discards merged; null before Linux 4.18."),
            discarded_bytes: Option<u64> = bytes(
                "Bytes discarded (512-byte sectors times 512); null before Linux 4.18.",
            ),
            discard_time_seconds: Option<f64> = seconds(
                "Time discards spent from issue to completion; null before Linux 4.18.",
            ),
            flushes_completed: Option<u64> = ops(
                "Cache flushes completed (fsync reaching the device); null before Linux 5.5.",
            ),
            flush_time_seconds: Option<f64> = seconds(
                "Time flushes spent from issue to completion; null before Linux 5.5.",
            ),
        ],
        exported: true,
    }
}

/// A statistic of a diskstats line and the [`BLOCK`] field it fills: a count
/// as is, 512-byte sectors (whatever the device's block size) as bytes, or
/// milliseconds as seconds.
#[derive(Clone, Copy)]
enum Stat {
    Count(for<'r, 'a> fn(&'r mut BlockRow<'a>) -> &'r mut Option<u64>),
    Sectors(for<'r, 'a> fn(&'r mut BlockRow<'a>) -> &'r mut Option<u64>),
    Millis(for<'r, 'a> fn(&'r mut BlockRow<'a>) -> &'r mut Option<f64>),
}

/// The statistics of a diskstats line after major, minor and name, in the
/// kernel's order (Documentation/admin-guide/iostats.rst): 11 before Linux
/// 4.18, 15 before 5.5, then 17. Further ones a newer kernel adds are not
/// ours to guess at.
static DISKSTATS: [Stat; 17] = [
    Stat::Count(|r| &mut r.reads_completed),
    Stat::Count(|r| &mut r.reads_merged),
    Stat::Sectors(|r| &mut r.read_bytes),
    Stat::Millis(|r| &mut r.read_time_seconds),
    Stat::Count(|r| &mut r.writes_completed),
    Stat::Count(|r| &mut r.writes_merged),
    Stat::Sectors(|r| &mut r.written_bytes),
    Stat::Millis(|r| &mut r.write_time_seconds),
    Stat::Count(|r| &mut r.in_flight),
    Stat::Millis(|r| &mut r.io_time_seconds),
    Stat::Millis(|r| &mut r.io_weighted_time_seconds),
    Stat::Count(|r| &mut r.discards_completed),
    Stat::Count(|r| &mut r.discards_merged),
    Stat::Sectors(|r| &mut r.discarded_bytes),
    Stat::Millis(|r| &mut r.discard_time_seconds),
    Stat::Count(|r| &mut r.flushes_completed),
    Stat::Millis(|r| &mut r.flush_time_seconds),
];

vtax_store::table! {
    /// The identity of a device, as tags of an info row.
    pub static BLOCK_DEVICE: TableDef, pub struct BlockDeviceRow {
        name: "block_device",
        help: "One row per block device per tick whose tags describe it: model, transport (nvme or \
               not) and where it hangs in the PCI tree; join on device.",
        tags: [
            device = DEVICE_TAG,
            model = TagDef {
                name: "model",
                help:
                    "Model from sysfs (device/model); empty where the driver gives none (virtio, dm).",
            },
            transport = TagDef {
                name: "transport",
                help: "nvme, virtio, scsi, ata, usb, mmc, dm (device mapper), md (software RAID), \
                       virtual (no hardware), other.",
            },
            pci_address = PCI_ADDRESS_TAG,
            numa_node = NUMA_NODE_TAG,
        ],
        fields: [info: u64 = info_field()],
        exported: true,
    }
}

/// Ticks between two reads of what describes the devices.
const RESCAN_TICKS: u64 = 60;

/// What a device is, read from sysfs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    /// Whether it gets rows (not excluded, not a skipped partition).
    wanted: bool,
    model: String,
    transport: &'static str,
    pci_address: String,
    numa_node: String,
}

/// The block collector.
pub struct Block {
    diskstats: KeptFile,
    sysfs: PathBuf,
    partitions: bool,
    exclude: Option<RegexSet>,
    known: HashMap<String, Identity>,
    ticks: u64,
    buf: Vec<u8>,
    rows: BatchBuilder,
    info_rows: BatchBuilder,
    /// Devices with rows at the last tick, for `probe`.
    seen: Vec<String>,
    /// Lines of diskstats that read badly at the last tick: each costs only
    /// its device's row.
    errors: Vec<ParseError>,
}

impl Block {
    /// A block collector reading under `roots`.
    pub fn new(config: &BlockConfig, roots: &Roots) -> Self {
        Block {
            diskstats: KeptFile::listing(roots.proc("diskstats")),
            sysfs: roots.sysfs.clone(),
            partitions: config.partitions,
            // `validate` has checked it; an invalid one (only possible by
            // skipping validation) excludes nothing.
            exclude: exclude_regex(&config.device_exclude, "").ok().flatten(),
            known: HashMap::new(),
            ticks: 0,
            buf: Vec::new(),
            rows: BatchBuilder::new(&BLOCK),
            info_rows: BatchBuilder::new(&BLOCK_DEVICE),
            seen: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn identify(&self, name: &str) -> Identity {
        if self.exclude.as_ref().is_some_and(|r| r.is_match(name)) {
            return Identity {
                wanted: false,
                ..identity_of(&self.sysfs, name)
            };
        }
        let mut id = identity_of(&self.sysfs, name);
        if id.wanted {
            return id;
        }
        // A partition: described by its disk.
        id.wanted = self.partitions;
        id
    }

    fn read(&mut self, time_us: i64) -> anyhow::Result<()> {
        let path = self.diskstats.path().display().to_string();
        let len = self
            .diskstats
            .read(&mut self.buf)
            .map_err(|e| anyhow!("{path}: {e}"))?;
        let text =
            std::str::from_utf8(&self.buf[..len]).map_err(|_| anyhow!("{path}: not UTF-8 text"))?;
        if self.ticks.is_multiple_of(RESCAN_TICKS) {
            self.known.clear();
        }
        let mut parsed = 0;
        for (n, line) in text.lines().enumerate() {
            let row = match parse_line(line, &path, n + 1) {
                Ok(Some(row)) => row,
                Ok(None) => continue,
                // One bad line costs its device's row this tick, not the
                // other devices' (a driver's odd line, a kernel's new layout).
                Err(e) => {
                    self.errors.push(e);
                    continue;
                }
            };
            parsed += 1;
            let name = row.device;
            if !self.known.contains_key(name) {
                let id = self.identify(name);
                self.known.insert(name.to_owned(), id);
            }
            let id = &self.known[name];
            if !id.wanted {
                continue;
            }
            self.rows.push_row(time_us, &row)?;
            let info = BlockDeviceRow {
                device: name,
                model: &id.model,
                transport: id.transport,
                pci_address: &id.pci_address,
                numa_node: &id.numa_node,
                info: 1,
            };
            self.info_rows.push_row(time_us, &info)?;
            self.seen.push(name.to_owned());
        }
        if parsed == 0 && !self.errors.is_empty() {
            // Nothing read well: the file is bad, not a line of it.
            return Err(self.errors.remove(0).into());
        }
        Ok(())
    }
}

/// One line of diskstats as the device's row, `None` for a blank line.
fn parse_line<'a>(
    line: &'a str,
    path: &str,
    line_no: usize,
) -> Result<Option<BlockRow<'a>>, ParseError> {
    let fail = |reason: String| ParseError {
        path: path.to_owned(),
        line: line_no,
        reason,
    };
    let mut words = line.split_ascii_whitespace();
    let (Some(_major), Some(_minor), Some(name)) = (words.next(), words.next(), words.next())
    else {
        if line.trim().is_empty() {
            return Ok(None);
        }
        return Err(fail("fewer than 3 fields".into()));
    };
    let mut row = BlockRow {
        device: name,
        ..BlockRow::default()
    };
    let mut count = 0;
    for (stat, word) in DISKSTATS.iter().zip(words) {
        let n: u64 = if !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit()) {
            word.parse()
                .map_err(|_| fail(format!("{word:?} overflows 64 bits")))?
        } else {
            return Err(fail(format!("{word:?} is not a number")));
        };
        match stat {
            Stat::Count(field) => *field(&mut row) = Some(n),
            Stat::Sectors(field) => {
                let bytes = n
                    .checked_mul(512)
                    .ok_or_else(|| fail(format!("{n} sectors overflow 64 bits of bytes")))?;
                *field(&mut row) = Some(bytes);
            }
            Stat::Millis(field) => *field(&mut row) = Some(n as f64 / 1000.0),
        }
        count += 1;
    }
    if !matches!(count, 11 | 15 | 17) {
        return Err(fail(format!(
            "{count} statistics for {name}: the kernel writes 11, 15 or 17"
        )));
    }
    Ok(Some(row))
}

/// What sysfs says of `name`; `wanted` is whether it is a whole disk.
fn identity_of(sysfs: &Path, name: &str) -> Identity {
    // The kernel writes `/` in a name (cciss/c0d0) as `!` in sysfs.
    let sys_name = name.replace('/', "!");
    let disk = sysfs.join("block").join(&sys_name);
    let class = sysfs.join("class/block").join(&sys_name);
    let is_disk = disk.exists() && !disk.join("partition").exists();
    // Where sysfs has no block class, there is nothing to tell a partition by:
    // every device counts as a disk rather than vanish.
    let no_sysfs = !sysfs.join("block").is_dir() && !sysfs.join("class/block").is_dir();
    let dir = if is_disk {
        disk
    } else if class.exists() {
        // A partition's directory sits inside its disk's.
        std::fs::canonicalize(&class)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or(class)
    } else {
        disk
    };
    let resolved = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
    let model = std::fs::read(dir.join("device/model"))
        .ok()
        .map(|b| super::platform::label(&String::from_utf8_lossy(&b)))
        .filter(|m| m != "unknown")
        .unwrap_or_default();
    let place = placement(&dir);
    Identity {
        wanted: is_disk || no_sysfs,
        model,
        transport: transport(name, &resolved),
        pci_address: place.pci_address,
        numa_node: place.numa_node,
    }
}

/// How a device is attached, from its name and resolved sysfs path.
fn transport(name: &str, resolved: &Path) -> &'static str {
    let path = resolved.to_string_lossy();
    let digit_after = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    };
    if digit_after("nvme") || path.contains("/nvme/") {
        "nvme"
    } else if digit_after("dm-") {
        "dm"
    } else if digit_after("md") {
        "md"
    } else if path.contains("/virtio") {
        "virtio"
    } else if path.contains("/usb") {
        "usb"
    } else if path.contains("/mmc_host/") {
        "mmc"
    } else if path.contains("/ata") {
        "ata"
    } else if path.contains("/host") && path.contains("/target") {
        "scsi"
    } else if path.contains("/devices/virtual/") {
        "virtual"
    } else {
        "other"
    }
}

impl Collector for Block {
    fn name(&self) -> &'static str {
        "block"
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.errors.clone()
    }

    fn probe(&mut self) -> Availability {
        self.known.clear();
        if let Err(e) = self.collect(0) {
            // No diskstats is a node without it; one that reads badly is
            // probed again until it mends.
            let reason = format!("{e:#}");
            return match self.diskstats.path().exists() {
                false => Availability::Absent(reason),
                true => Availability::Failed(reason),
            };
        }
        if self.seen.is_empty() {
            return Availability::Absent(format!(
                "no block device in {} outside collectors.block.device_exclude",
                self.diskstats.path().display()
            ));
        }
        let described: Vec<String> = self
            .seen
            .iter()
            .map(|name| {
                let id = &self.known[name];
                match id.numa_node.as_str() {
                    "" => format!("{name} ({})", id.transport),
                    node => format!("{name} ({}, NUMA node {node})", id.transport),
                }
            })
            .collect();
        Availability::Available(format!(
            "{} device{}: {}",
            described.len(),
            if described.len() == 1 { "" } else { "s" },
            described.join(", ")
        ))
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        self.seen.clear();
        self.errors.clear();
        let result = self.read(time_us);
        self.ticks = self.ticks.wrapping_add(1);
        // Finish both builders even on error so no half-tick leaks into the next.
        let batches = [self.rows.finish(), self.info_rows.finish()];
        result?;
        Ok(batches.into_iter().filter(|b| !b.is_empty()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{f64s, node, roots, tags, u64s};

    #[test]
    fn tables_are_valid() {
        for table in TABLES {
            table.validate().unwrap();
        }
        // Each diskstats statistic fills a field of its own, of its unit.
        let mut filled = std::collections::HashSet::new();
        for stat in &DISKSTATS {
            let mut row = BlockRow::default();
            let unit = match stat {
                Stat::Count(field) => {
                    *field(&mut row) = Some(1);
                    Unit::None
                }
                Stat::Sectors(field) => {
                    *field(&mut row) = Some(1);
                    Unit::Bytes
                }
                Stat::Millis(field) => {
                    *field(&mut row) = Some(1.0);
                    Unit::Seconds
                }
            };
            let mut rows = BatchBuilder::new(&BLOCK);
            rows.push_row(0, &row).unwrap();
            let batch = rows.finish();
            let set: Vec<_> = (0..BLOCK.fields.len())
                .filter(|&i| batch.fields[i].is_valid(0))
                .collect();
            assert_eq!(set.len(), 1);
            let field = &BLOCK.fields[set[0]];
            assert_eq!(field.unit, unit, "{}", field.name);
            assert!(filled.insert(field.name), "{} twice", field.name);
        }
        assert_eq!(filled.len(), BLOCK.fields.len());
        assert_eq!(
            BLOCK.metric_name(&BLOCK.fields[6]),
            "vtax_block_written_bytes_total"
        );
    }

    #[test]
    fn vm_node_has_one_virtio_disk_and_skips_loop_and_zram() {
        let mut c = Block::new(&BlockConfig::default(), &roots(&node("vm-node")));
        match c.probe() {
            Availability::Available(s) => assert_eq!(s, "1 device: vda (virtio)"),
            other => panic!("{other:?}"),
        }
        let batches = c.collect(7).unwrap();
        let (rows, info) = (&batches[0], &batches[1]);
        assert_eq!(tags(rows, "device"), ["vda"]);
        // Captured: 254 0 vda 2092358 50931 171839002 3290914 911833 181084 343028512 1740241 0 294020 5095859 227958 57 336464496 55404 224754 9299
        assert_eq!(u64s(rows, "reads_completed"), [Some(2_092_358)]);
        assert_eq!(u64s(rows, "read_bytes"), [Some(171_839_002 * 512)]);
        assert_eq!(f64s(rows, "read_time_seconds"), [Some(3290.914)]);
        assert_eq!(u64s(rows, "written_bytes"), [Some(343_028_512 * 512)]);
        assert_eq!(u64s(rows, "in_flight"), [Some(0)]);
        assert_eq!(f64s(rows, "io_time_seconds"), [Some(294.020)]);
        assert_eq!(f64s(rows, "io_weighted_time_seconds"), [Some(5095.859)]);
        assert_eq!(u64s(rows, "discarded_bytes"), [Some(336_464_496 * 512)]);
        assert_eq!(u64s(rows, "flushes_completed"), [Some(224_754)]);
        assert_eq!(f64s(rows, "flush_time_seconds"), [Some(9.299)]);
        assert_eq!(tags(info, "transport"), ["virtio"]);
        assert_eq!(tags(info, "model"), [""]);
        assert_eq!(tags(info, "pci_address"), ["0000:00:02.0"]);
        assert_eq!(tags(info, "numa_node"), [""], "the VM's PCI says -1");
    }

    #[test]
    fn baremetal_node_has_nvme_drives_on_both_numa_nodes() {
        let mut c = Block::new(&BlockConfig::default(), &roots(&node("baremetal-node")));
        let batches = c.collect(7).unwrap();
        let info = &batches[1];
        assert_eq!(
            tags(info, "device"),
            ["nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1", "sda", "md0"]
        );
        assert_eq!(
            tags(info, "transport"),
            ["nvme", "nvme", "nvme", "nvme", "ata", "md"]
        );
        assert_eq!(tags(info, "numa_node"), ["0", "0", "1", "1", "0", ""]);
        assert_eq!(tags(info, "model")[0], "SAMSUNG MZQL27T6HBLA-00A07");
        assert_eq!(tags(info, "pci_address")[2], "0000:9c:00.0");
        assert_eq!(tags(info, "pci_address")[4], "0000:00:17.0");
        // Partitions off by default; on, they come with their disk's identity.
        let batches = collect_with_partitions("baremetal-node");
        let info = &batches[1];
        let devices = tags(info, "device");
        let p = devices.iter().position(|d| d == "sda1").expect("sda1");
        assert_eq!(tags(info, "transport")[p], "ata");
        assert_eq!(tags(info, "model")[p], "SAMSUNG MZ7L3480");
        assert_eq!(devices.len(), 8, "{devices:?}");
        let rows = &batches[0];
        let md = devices.iter().position(|d| d == "md0").unwrap();
        assert_eq!(u64s(rows, "flushes_completed")[md], Some(481_570));
        assert_eq!(u64s(rows, "written_bytes")[md], Some(104_812_999_168 * 512));
    }

    /// A tree the kernel wrote (Debian's 6.1 nvme driver on QEMU's emulated
    /// controllers, `tests/fixtures/capture/capture-nvme.sh`), not one written
    /// by hand: the model is padded to NVMe's 40 bytes, a namespace's `device`
    /// link names its controller, and minor numbers follow probe order.
    #[test]
    fn nvme_tree_captured_from_the_kernel_reads_as_written() {
        let mut c = Block::new(&BlockConfig::default(), &roots(&node("nvme-vm-node")));
        let batches = c.collect(3).unwrap();
        let (rows, info) = (&batches[0], &batches[1]);
        assert_eq!(tags(rows, "device"), ["nvme1n1", "nvme0n1"]);
        assert_eq!(tags(info, "device"), ["nvme1n1", "nvme0n1"]);
        assert_eq!(tags(info, "transport"), ["nvme", "nvme"]);
        assert_eq!(tags(info, "model"), ["QEMU NVMe Ctrl", "QEMU NVMe Ctrl"]);
        assert_eq!(tags(info, "pci_address"), ["0000:00:05.0", "0000:00:04.0"]);
        // numa_node -1: a machine with one node.
        assert_eq!(tags(info, "numa_node"), ["", ""]);
        // `259 0 nvme1n1 3 0 24 0 10 63 8704 12 0 8 18 1 0 2048 1 1 4`
        assert_eq!(u64s(rows, "reads_completed"), [Some(3), Some(25)]);
        assert_eq!(
            u64s(rows, "read_bytes"),
            [Some(24 * 512), Some(18_664 * 512)]
        );
        assert_eq!(u64s(rows, "writes_completed"), [Some(10), Some(0)]);
        assert_eq!(u64s(rows, "writes_merged"), [Some(63), Some(0)]);
        assert_eq!(u64s(rows, "written_bytes"), [Some(8_704 * 512), Some(0)]);
        assert_eq!(f64s(rows, "write_time_seconds"), [Some(0.012), Some(0.0)]);
        assert_eq!(u64s(rows, "discards_completed"), [Some(1), Some(0)]);
        assert_eq!(u64s(rows, "discarded_bytes"), [Some(2_048 * 512), Some(0)]);
        assert_eq!(u64s(rows, "flushes_completed"), [Some(1), Some(0)]);
        assert_eq!(f64s(rows, "flush_time_seconds"), [Some(0.004), Some(0.0)]);

        let batches = collect_with_partitions("nvme-vm-node");
        let info = &batches[1];
        assert_eq!(tags(info, "device"), ["nvme1n1", "nvme0n1", "nvme0n1p1"]);
        assert_eq!(tags(info, "transport")[2], "nvme");
        assert_eq!(tags(info, "pci_address")[2], "0000:00:04.0");
        assert_eq!(u64s(&batches[0], "read_bytes")[2], Some(1_248 * 512));
    }

    /// The hand-written NVMe controllers of `baremetal-node` keep the layout
    /// the kernel gave the captured ones: attributes padded to the NVMe
    /// identify fields' widths, and the same links between namespace,
    /// controller and PCI function.
    #[test]
    fn hand_written_nvme_controllers_are_laid_out_as_the_kernel_lays_them() {
        let layout = |root: &Path, controller: &str| {
            let sys = root.join("sys");
            let dir = sys.join("class/nvme").join(controller);
            let width = |name: &str| std::fs::read(dir.join(name)).unwrap().len();
            let link = |path: PathBuf| {
                let target = std::fs::read_link(path).unwrap();
                // The shape of a link: how many levels it climbs, and what it then names.
                let ups = target
                    .components()
                    .filter(|c| c.as_os_str() == "..")
                    .count();
                let tail = target.file_name().unwrap().to_string_lossy().into_owned();
                (ups, tail.starts_with(controller), tail.contains(':'))
            };
            let namespace = format!("{controller}n1");
            (
                [width("model"), width("serial"), width("firmware_rev")],
                link(dir.join("device")),
                link(dir.join(&namespace).join("device")),
                std::fs::read_link(sys.join("block").join(&namespace))
                    .unwrap()
                    .ends_with(format!("nvme/{controller}/{namespace}")),
            )
        };
        let kernel = layout(&node("nvme-vm-node"), "nvme0");
        assert_eq!(kernel.0, [41, 21, 9], "40, 20 and 8 bytes and a newline");
        for controller in ["nvme0", "nvme1", "nvme2", "nvme3"] {
            assert_eq!(
                layout(&node("baremetal-node"), controller),
                kernel,
                "{controller}"
            );
        }
    }

    /// One read of `fixture` with partitions on.
    fn collect_with_partitions(fixture: &str) -> Vec<Batch> {
        let config = BlockConfig {
            partitions: true,
            ..BlockConfig::default()
        };
        Block::new(&config, &roots(&node(fixture)))
            .collect(1)
            .unwrap()
    }

    fn with_diskstats(text: &str) -> (tempfile::TempDir, Block) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(dir.path().join("proc/diskstats"), text).unwrap();
        let c = Block::new(&BlockConfig::default(), &roots(dir.path()));
        (dir, c)
    }

    #[test]
    fn older_kernels_leave_discards_and_flushes_null() {
        let (_dir, mut c) = with_diskstats(
            "   8       0 sda 1 2 3 4 5 6 7 8 9 10 11\n 8 16 sdb 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15\n",
        );
        let batches = c.collect(1).unwrap();
        let rows = &batches[0];
        assert_eq!(tags(rows, "device"), ["sda", "sdb"]);
        assert_eq!(u64s(rows, "discards_completed"), [None, Some(12)]);
        assert_eq!(u64s(rows, "flushes_completed"), [None, None]);
        assert_eq!(
            f64s(rows, "io_weighted_time_seconds"),
            [Some(0.011), Some(0.011)]
        );
        // Without sysfs every device is taken for a disk, described as far as can be.
        assert_eq!(tags(&batches[1], "transport"), ["other", "other"]);
    }

    #[test]
    fn garbage_names_the_file_and_line() {
        for (text, want) in [
            (
                "8 0 sda 1 2 3\n",
                ":1: 3 statistics for sda: the kernel writes 11, 15 or 17",
            ),
            (
                "8 0 sda 1 2 3 4 5 6 7 8 9 10 -11\n",
                ":1: \"-11\" is not a number",
            ),
            (
                "8 0 sda 1 2 99999999999999999999 4 5 6 7 8 9 10 11\n",
                ":1: \"99999999999999999999\" overflows 64 bits",
            ),
            (
                "8 0 sda 1 2 18446744073709551615 4 5 6 7 8 9 10 11\n",
                ":1: 18446744073709551615 sectors overflow 64 bits of bytes",
            ),
            ("8 0\n", ":1: fewer than 3 fields"),
        ] {
            let (dir, mut c) = with_diskstats(text);
            let err = c.collect(1).unwrap_err().to_string();
            let path = dir.path().join("proc/diskstats").display().to_string();
            assert_eq!(err, format!("{path}{want}"), "{text:?}");
            // The next tick is not poisoned by the half-built one.
            std::fs::write(
                dir.path().join("proc/diskstats"),
                "8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n",
            )
            .unwrap();
            assert_eq!(c.collect(2).unwrap()[0].len(), 1);
        }
        // One bad line among good ones costs its device's row only, and is
        // named; the next tick without it has no error.
        let (dir, mut c) = with_diskstats(
            "8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n8 1 sdb 1 2 x 4 5 6 7 8 9 10 11\n\
             8 16 sdc 1 2 3 4 5 6 7 8 9 10 11\n",
        );
        let batches = c.collect(1).unwrap();
        assert_eq!(tags(&batches[0], "device"), ["sda", "sdc"]);
        let path = dir.path().join("proc/diskstats").display().to_string();
        let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
        assert_eq!(errors, [format!("{path}:2: \"x\" is not a number")]);
        std::fs::write(
            dir.path().join("proc/diskstats"),
            "8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n",
        )
        .unwrap();
        c.collect(2).unwrap();
        assert!(c.source_errors().is_empty());

        let (dir, mut c) = with_diskstats("");
        std::fs::write(dir.path().join("proc/diskstats"), b"8 0 sd\xff 1\n").unwrap();
        assert!(c
            .collect(1)
            .unwrap_err()
            .to_string()
            .ends_with("not UTF-8 text"));
        std::fs::remove_file(dir.path().join("proc/diskstats")).unwrap();
        let mut c = Block::new(&BlockConfig::default(), &roots(dir.path()));
        let Availability::Absent(why) = c.probe() else {
            panic!("absent without diskstats")
        };
        assert!(why.contains("proc/diskstats: No such file"), "{why}");
    }

    #[test]
    fn truncation_at_every_byte_never_panics() {
        let text = std::fs::read_to_string(node("baremetal-node").join("proc/diskstats")).unwrap();
        for cut in 0..text.len() {
            let (_dir, mut c) = with_diskstats(&text[..cut]);
            let _ = c.collect(1);
        }
    }

    #[test]
    fn devices_appearing_are_described_at_once() {
        let (dir, mut c) = with_diskstats("8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n");
        c.collect(1).unwrap();
        std::fs::write(
            dir.path().join("proc/diskstats"),
            "8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n259 0 nvme0n1 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n7 0 loop0 1 2 3 4 5 6 7 8 9 10 11\n",
        )
        .unwrap();
        let batches = c.collect(2).unwrap();
        assert_eq!(tags(&batches[1], "device"), ["sda", "nvme0n1"]);
        assert_eq!(tags(&batches[1], "transport"), ["other", "nvme"]);
    }

    #[test]
    fn config_keys() {
        let config: BlockConfig =
            toml::from_str("partitions = true\ndevice_exclude = \"^sd\"\n").unwrap();
        assert!(config.partitions);
        config.validate().unwrap();
        assert!(toml::from_str::<BlockConfig>("partition = true\n").is_err());
        let bad = BlockConfig {
            device_exclude: "(".into(),
            ..BlockConfig::default()
        };
        let (key, message) = bad.validate().unwrap_err();
        assert_eq!(key, "collectors.block.device_exclude");
        assert_eq!(
            message,
            "collectors.block.device_exclude = \"(\": not a regular expression: unclosed group"
        );
        for key in ["partitions", "device_exclude"] {
            assert!(KEY_DOCS.iter().any(|(k, _)| *k == key), "{key}");
        }
        let config = BlockConfig {
            device_exclude: String::new(),
            ..BlockConfig::default()
        };
        let (_dir, _) = with_diskstats("");
        let mut c = Block::new(&config, &roots(&node("vm-node")));
        let batches = c.collect(1).unwrap();
        assert_eq!(
            tags(&batches[0], "device"),
            [
                "loop0", "loop1", "loop2", "loop3", "loop4", "loop5", "loop6", "loop7", "vda",
                "zram0"
            ]
        );
    }
}
