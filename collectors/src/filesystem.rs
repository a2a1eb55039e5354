//! `filesystem`: size, free space and free inodes of the mounts that hold
//! checkpoints and data, from `<procfs>/self/mountinfo` and `statvfs(2)`.
//!
//! A `statvfs` on a network filesystem whose server is gone blocks in the
//! kernel, uninterruptibly on a `hard` NFS mount, for as long as the server
//! stays away. So each mount is stat'ed on a thread of its own and the
//! collector waits for it only up to `stat_timeout_ms`: a stat still running
//! then is reported (`stat_hung` = 1, a problem for `vtax doctor`) and is not
//! issued again until it returns, so a hung mount costs one parked thread,
//! not one per tick. When it returns, the next tick stats the mount afresh.
//! A mount's thread lives from tick to tick, waiting for the next ask: a
//! thread started and ended for every stat cost more than the stat and a
//! message each way together (`bench/agent/filesystem_mounts_cpu.py`), and
//! a node with dozens of mounts (a Kubernetes node's volumes) pays it for
//! each of them every second.
//!
//! The stat is behind [`StatFs`] so tests make it hang, fail or answer fixed
//! numbers; the mount table comes from the fixture's `proc/self/mountinfo`.
//! Installed as a service, the agent is in the host's mount namespace and
//! stats each mount point as it sees it. In a container (`--path.rootfs
//! /host`, the host's `/` bind-mounted at `/host` and the host's PID
//! namespace, as node_exporter is run), its own mount table is the
//! container's: the host's is that of the host's init, `<procfs>/1/mountinfo`,
//! and each host mount point is stat'ed under the rootfs and reported by its
//! host path.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

use super::kept::KeptFile;
use super::{Availability, Collector, ParseError, Roots};

/// Filesystem types read by default: local disk filesystems and the network
/// and parallel filesystems that hold checkpoints and training data.
pub const DEFAULT_FS_TYPES: &[&str] = &[
    "ext2",
    "ext3",
    "ext4",
    "xfs",
    "btrfs",
    "zfs",
    "f2fs",
    "bcachefs",
    "vfat",
    "lustre",
    "gpfs",
    "beegfs",
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "ceph",
    "fuse.weka",
    "wekafs",
];

/// The most mounts read: each takes a thread and a set of series. A
/// Kubernetes node's volumes (a CSI volume mounted twice per pod) stay well
/// under it; a mount table grown by a runaway mounter does not take the
/// agent with it.
pub const DEFAULT_MAX_MOUNTS: u32 = 256;

/// How long a tick waits for a stat: a healthy NFS server answers in
/// milliseconds, and a tick of the default 1 s interval must stay shorter.
pub const DEFAULT_STAT_TIMEOUT_MS: u64 = 500;

/// `[collectors.filesystem]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesystemConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
    /// Filesystem types to read, when `mount_points` is empty.
    pub fs_types: Vec<String>,
    /// Mount points to read, whatever their type; empty reads by `fs_types`.
    pub mount_points: Vec<String>,
    /// Milliseconds a tick waits for one `statvfs` before calling it hung.
    pub stat_timeout_ms: u64,
    /// The most mounts read, in the mount table's order; the rest are left
    /// out and counted.
    pub max_mounts: u32,
}

impl Default for FilesystemConfig {
    fn default() -> Self {
        FilesystemConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            fs_types: DEFAULT_FS_TYPES.iter().map(|s| s.to_string()).collect(),
            mount_points: Vec::new(),
            stat_timeout_ms: DEFAULT_STAT_TIMEOUT_MS,
            max_mounts: DEFAULT_MAX_MOUNTS,
        }
    }
}

crate::common_settings!(FilesystemConfig);

impl crate::Registered for FilesystemConfig {
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
        _all: &crate::CollectorsConfig,
        roots: &crate::Roots,
    ) -> Box<dyn crate::Collector> {
        Box::new(Filesystem::new(self, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        self.validate()
    }
}

impl FilesystemConfig {
    /// Checks the timeout; on failure the dotted key and the message.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !(1..=60_000).contains(&self.stat_timeout_ms) {
            let key = "collectors.filesystem.stat_timeout_ms";
            return Err((
                key.into(),
                format!(
                    "{key} = {}: must be between 1 and 60000",
                    self.stat_timeout_ms
                ),
            ));
        }
        if !(1..=65_536).contains(&self.max_mounts) {
            let key = "collectors.filesystem.max_mounts";
            return Err((
                key.into(),
                format!("{key} = {}: must be between 1 and 65536", self.max_mounts),
            ));
        }
        Ok(())
    }
}

/// Ranges of this collector's own numeric keys.
pub static KEY_RANGES: crate::keys::KeyRanges = &[
    (
        "stat_timeout_ms",
        crate::keys::KeyRange::between(1.0, 60_000.0),
    ),
    ("max_mounts", crate::keys::KeyRange::between(1.0, 65_536.0)),
];

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[
    (
        "fs_types",
        "Read mounts of these filesystem types (the third field after \" - \" in /proc/self/mountinfo); used when mount_points is empty.",
    ),
    (
        "mount_points",
        "Read exactly these mount points, whatever their type (e.g. [\"/\", \"/raid\", \"/lustre\"]); empty reads every mount of fs_types.",
    ),
    (
        "stat_timeout_ms",
        "Milliseconds a tick waits for statvfs on one mount before reporting it hung (stat_hung = 1); a hung stat is not issued again until it returns.",
    ),
    (
        "max_mounts",
        "Read at most this many mounts, in the mount table's order; the rest are left out (vtax_collector_left_out) and vtax doctor says how many.",
    ),
];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&FILESYSTEM];

const fn gauge(name: &'static str, unit: Unit, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::U64, unit, help)
}

vtax_store::table! {
    /// One mount's numbers.
    pub static FILESYSTEM: TableDef, pub struct FilesystemRow {
        name: "filesystem",
        help: "One row per selected mount per tick: size, free space and inodes from statvfs, the \
               read-only flag from /proc/self/mountinfo, and whether the stat hung or failed (then \
               the sizes are null).",
        tags: [
            mount_point = TagDef {
                name: "mount_point",
                help: "Where the filesystem is mounted.",
            },
            device = TagDef {
                name: "device",
                help: "The mount source: a device (/dev/nvme0n1p1), server:/export for NFS, MGS@tcp:/fs for Lustre.",
            },
            fs_type = TagDef {
                name: "fs_type",
                help: "Filesystem type (ext4, xfs, nfs4, lustre, gpfs, beegfs, ...).",
            },
        ],
        fields: [
            size_bytes: Option<u64> = gauge(Unit::Bytes, "Total size."),
            free_bytes: Option<u64> = gauge(
                Unit::Bytes,
                "Free space, the root-reserved part included.",
            ),
            avail_bytes: Option<u64> = gauge(
                Unit::Bytes,
                "Free space an unprivileged writer (a training job) can use.",
            ),
            files: Option<u64> = gauge(
                Unit::None,
                "Inodes in total; 0 where the filesystem has no fixed count.",
            ),
            files_free: Option<u64> = gauge(Unit::None, "Free inodes."),
            read_only: u64 = gauge(
                Unit::None,
                "1 when mounted read-only (the mount's or the superblock's options).",
            ),
            stat_hung: u64 = gauge(
                Unit::None,
                "1 while a statvfs of this mount has not returned within stat_timeout_ms: a hung network filesystem.",
            ),
            stat_error: u64 = gauge(
                Unit::None,
                "1 when statvfs failed (ESTALE from a stale NFS handle, EIO, EACCES); the error is a doctor problem.",
            ),
        ],
        exported: true,
    }
}

/// What `statvfs` says of a filesystem, in its own units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStat {
    /// Fundamental block size (`f_frsize`): the unit of the block counts.
    pub fragment_size: u64,
    /// Blocks in total.
    pub blocks: u64,
    /// Free blocks.
    pub blocks_free: u64,
    /// Free blocks for unprivileged users.
    pub blocks_available: u64,
    /// Inodes in total.
    pub files: u64,
    /// Free inodes.
    pub files_free: u64,
}

/// Where stats come from: the kernel, or what a test says (hang included).
pub trait StatFs: Send + Sync {
    /// `statvfs(2)` of `path`; may block for as long as the kernel does.
    fn statvfs(&self, path: &Path) -> io::Result<FsStat>;
}

/// The kernel's `statvfs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemStatFs;

impl StatFs for SystemStatFs {
    fn statvfs(&self, path: &Path) -> io::Result<FsStat> {
        let s = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
        #[allow(clippy::unnecessary_cast)] // the widths differ by target
        Ok(FsStat {
            fragment_size: s.fragment_size() as u64,
            blocks: s.blocks() as u64,
            blocks_free: s.blocks_free() as u64,
            blocks_available: s.blocks_available() as u64,
            files: s.files() as u64,
            files_free: s.files_free() as u64,
        })
    }
}

/// A mount read from mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The kernel's id of the mount (mountinfo's first field): a new mount on
    /// the same point has another.
    pub id: u64,
    /// Mount point, unescaped.
    pub mount_point: String,
    /// Filesystem type.
    pub fs_type: String,
    /// Mount source, unescaped.
    pub source: String,
    /// Whether the mount or its superblock is read-only.
    pub read_only: bool,
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012`
/// newline, `\134` backslash).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let n = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            if let Ok(byte) = u8::try_from(n) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/<pid>/mountinfo`, line by line: a line that is not a
/// mountinfo line (or not UTF-8 text) costs only its own mount and is
/// returned among the errors.
pub fn parse_mountinfo(bytes: &[u8], path: &str) -> (Vec<Mount>, Vec<ParseError>) {
    let mut mounts = Vec::new();
    let mut errors = Vec::new();
    for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
        match parse_mountinfo_line(line, path, n + 1) {
            Ok(Some(mount)) => mounts.push(mount),
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
    }
    (mounts, errors)
}

/// One line of mountinfo; `None` for a blank one.
fn parse_mountinfo_line(
    line: &[u8],
    path: &str,
    line_no: usize,
) -> Result<Option<Mount>, ParseError> {
    let fail = |reason: &str| ParseError {
        path: path.to_owned(),
        line: line_no,
        reason: reason.to_owned(),
    };
    let line = std::str::from_utf8(line).map_err(|_| fail("not UTF-8 text"))?;
    if line.trim().is_empty() {
        return Ok(None);
    }
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields
        .iter()
        .position(|f| *f == "-")
        .ok_or_else(|| fail("no \" - \" separator"))?;
    if sep < 6 || fields.len() < sep + 4 {
        return Err(fail("fewer fields than mountinfo has"));
    }
    // The root is a path, or a namespace's (`net:[4026532174]`) where `ip
    // netns`, a CNI plugin, Docker or snapd bind-mounts one: such lines were
    // taken for damage, and the collector's source counted failing on every
    // node with a named network namespace.
    let root = fields[3];
    let namespace_root = root.ends_with(']') && root.contains(":[");
    if !fields[2].contains(':') || !(root.starts_with('/') || namespace_root) {
        return Err(fail("not a mountinfo line"));
    }
    let ro = |opts: &str| opts.split(',').any(|o| o == "ro");
    let id = fields[0]
        .parse()
        .map_err(|_| fail("a mount id that is not a number"))?;
    Ok(Some(Mount {
        id,
        mount_point: unescape(fields[4]),
        fs_type: fields[sep + 1].to_owned(),
        source: unescape(fields[sep + 2]),
        read_only: ro(fields[5]) || ro(fields[sep + 3]),
    }))
}

/// The answer to one stat.
type Answer = io::Result<FsStat>;

/// One mount's stat thread, and the stat it has not answered yet. The
/// thread stats the mount at each ask and answers on the ask's channel,
/// then waits for the next ask. Dropping the `Stater` ends the thread once
/// its stat in progress, if any, returns.
struct Stater {
    asks: mpsc::Sender<mpsc::SyncSender<Answer>>,
    /// The stat asked for and not yet answered: one at most.
    pending: Option<Pending>,
}

impl Stater {
    fn spawn(statfs: Arc<dyn StatFs>, path: PathBuf) -> io::Result<Stater> {
        let (asks, inbox) = mpsc::channel::<mpsc::SyncSender<Answer>>();
        std::thread::Builder::new()
            .name("statvfs".into())
            .spawn(move || {
                for answer in inbox {
                    let _ = answer.send(statfs.statvfs(&path));
                }
            })?;
        Ok(Stater {
            asks,
            pending: None,
        })
    }
}

/// A mount's id and point, which its stat thread is kept by.
type MountKey = (u64, String);

fn key_of(mount: &Mount) -> MountKey {
    (mount.id, mount.mount_point.clone())
}

/// A stat issued and not yet answered.
struct Pending {
    since: Instant,
    answer: Receiver<Answer>,
}

/// The filesystem collector.
pub struct Filesystem {
    mountinfo: KeptFile,
    roots: Roots,
    fs_types: Vec<String>,
    mount_points: Vec<String>,
    timeout: Duration,
    max_mounts: usize,
    /// Mounts over `max_mounts` at the last tick.
    over_max_mounts: usize,
    statfs: Arc<dyn StatFs>,
    /// Each mount's stat thread and its stat still running, by mount id and
    /// point: a healthy mount put on the point of a hung one is not the hung
    /// one.
    staters: HashMap<MountKey, Stater>,
    buf: Vec<u8>,
    rows: BatchBuilder,
    problems: Vec<String>,
    /// `mount_point (fs_type)` of the mounts read at the last tick, for `probe`.
    seen: Vec<String>,
    /// Lines of the mount table that read badly at the last tick: each costs
    /// only its own mount.
    errors: Vec<ParseError>,
}

impl Filesystem {
    /// A filesystem collector reading under `roots`, stat'ing with the kernel.
    pub fn new(config: &FilesystemConfig, roots: &Roots) -> Self {
        Filesystem::with_statfs(config, roots, Arc::new(SystemStatFs))
    }

    /// A filesystem collector whose stats come from `statfs`.
    pub fn with_statfs(config: &FilesystemConfig, roots: &Roots, statfs: Arc<dyn StatFs>) -> Self {
        Filesystem {
            mountinfo: KeptFile::listing(roots.proc(if roots.rootfs_moved() {
                "1/mountinfo"
            } else {
                "self/mountinfo"
            })),
            roots: roots.clone(),
            fs_types: config.fs_types.clone(),
            mount_points: config.mount_points.clone(),
            timeout: Duration::from_millis(config.stat_timeout_ms),
            max_mounts: config.max_mounts as usize,
            over_max_mounts: 0,
            statfs,
            staters: HashMap::new(),
            buf: Vec::new(),
            rows: BatchBuilder::new(&FILESYSTEM),
            problems: Vec::new(),
            seen: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// Stats still outstanding (hung).
    #[cfg(test)]
    fn hung(&self) -> usize {
        self.staters.values().filter(|s| s.pending.is_some()).count()
    }

    /// `mount`'s stat still running, if any.
    fn pending(&self, mount: &MountKey) -> Option<&Pending> {
        self.staters.get(mount)?.pending.as_ref()
    }

    /// Forgets `mount`'s stat still running: it answered, or cannot.
    fn answered(&mut self, mount: &MountKey) {
        if let Some(stater) = self.staters.get_mut(mount) {
            stater.pending = None;
        }
    }

    fn mounts(&mut self) -> anyhow::Result<Vec<Mount>> {
        let path = self.mountinfo.path().display().to_string();
        let len = self
            .mountinfo
            .read(&mut self.buf)
            .map_err(|e| anyhow!("{path}: {e}"))?;
        let (all, errors) = parse_mountinfo(&self.buf[..len], &path);
        self.errors = errors;
        if all.is_empty() && !self.errors.is_empty() {
            // Not one line read well: the table is bad, not a line of it.
            return Err(self.errors.remove(0).into());
        }
        // A later mount on the same point hides the earlier one: the last
        // on each point is the one seen, at the place it was mounted.
        let visible: Vec<bool> = {
            let mut last_on_point: HashMap<&str, usize> = HashMap::with_capacity(all.len());
            for (i, mount) in all.iter().enumerate() {
                last_on_point.insert(&mount.mount_point, i);
            }
            (0..all.len())
                .map(|i| last_on_point.get(all[i].mount_point.as_str()) == Some(&i))
                .collect()
        };
        let wanted = |mount: &Mount| {
            if self.mount_points.is_empty() {
                self.fs_types.contains(&mount.fs_type)
            } else {
                self.mount_points.contains(&mount.mount_point)
            }
        };
        let mut chosen: Vec<Mount> = all
            .into_iter()
            .zip(visible)
            .filter(|(mount, visible)| *visible && wanted(mount))
            .map(|(mount, _)| mount)
            .collect();
        self.over_max_mounts = chosen.len().saturating_sub(self.max_mounts);
        chosen.truncate(self.max_mounts);
        Ok(chosen)
    }

    /// Asks `mount`'s stat thread for a stat, starting the thread if the
    /// mount has none (or its thread is gone).
    fn issue(&mut self, mount: &MountKey) -> io::Result<()> {
        let (tx, rx) = mpsc::sync_channel(1);
        let unsent = match self.staters.get(mount) {
            Some(stater) => stater.asks.send(tx).err().map(|e| e.0),
            None => Some(tx),
        };
        if let Some(tx) = unsent {
            let stater = Stater::spawn(self.statfs.clone(), self.roots.host_path(&mount.1))?;
            stater
                .asks
                .send(tx)
                .map_err(|_| io::Error::other("the stat thread died"))?;
            self.staters.insert(mount.clone(), stater);
        }
        if let Some(stater) = self.staters.get_mut(mount) {
            stater.pending = Some(Pending {
                since: Instant::now(),
                answer: rx,
            });
        }
        Ok(())
    }

    fn read(&mut self, time_us: i64) -> anyhow::Result<()> {
        let mounts = self.mounts()?;
        let start = Instant::now();
        let deadline = start + self.timeout;
        let keys: Vec<MountKey> = mounts.iter().map(key_of).collect();
        let mut answers: HashMap<MountKey, Answer> = HashMap::new();
        // Issue every stat first, so they run side by side within one timeout.
        for mp in &keys {
            if let Some(p) = self.pending(mp) {
                match p.answer.try_recv() {
                    // The hung stat came back: its numbers are old, ask again.
                    Ok(_) | Err(TryRecvError::Disconnected) => self.answered(mp),
                    Err(TryRecvError::Empty) => continue,
                }
            }
            if let Err(e) = self.issue(mp) {
                answers.insert(mp.clone(), Err(e));
            }
        }
        for mp in &keys {
            let Some(p) = self.pending(mp) else {
                continue;
            };
            if p.since < start {
                continue; // hung since an earlier tick: no waiting on it again
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match p.answer.recv_timeout(left) {
                Ok(answer) => {
                    answers.insert(mp.clone(), answer);
                    self.answered(mp);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.answered(mp);
                    answers.insert(mp.clone(), Err(io::Error::other("the stat thread died")));
                }
            }
        }
        // Forget mounts that went away; their threads finish alone. A mount
        // whose stat hangs stays until the stat returns: gone from the table
        // for a tick and back, it would be asked again on a new thread, one
        // more parked on the same hung filesystem each time.
        let current: std::collections::HashSet<&MountKey> = keys.iter().collect();
        self.staters.retain(|key, stater| {
            current.contains(key)
                || stater
                    .pending
                    .as_ref()
                    .is_some_and(|p| matches!(p.answer.try_recv(), Err(TryRecvError::Empty)))
        });

        for (mount, key) in mounts.iter().zip(&keys) {
            let mp = &mount.mount_point;
            let mut row = FilesystemRow {
                mount_point: mp,
                device: &mount.source,
                fs_type: &mount.fs_type,
                read_only: u64::from(mount.read_only),
                ..FilesystemRow::default()
            };
            if let Some(p) = self.pending(key) {
                row.stat_hung = 1;
                self.problems.push(format!(
                    "statvfs({mp}) on {} ({}) has not returned for {:.1} s: the filesystem is hung (server unreachable?); not asked again until it returns",
                    mount.source,
                    mount.fs_type,
                    p.since.elapsed().as_secs_f64()
                ));
            } else {
                match answers.remove(key) {
                    Some(Ok(s)) => {
                        let f = s.fragment_size;
                        let bytes = |blocks: u64| Some(blocks.saturating_mul(f));
                        row.size_bytes = bytes(s.blocks);
                        row.free_bytes = bytes(s.blocks_free);
                        row.avail_bytes = bytes(s.blocks_available);
                        row.files = Some(s.files);
                        row.files_free = Some(s.files_free);
                    }
                    // Unmounted between mountinfo and the stat.
                    Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => continue,
                    Some(Err(e)) => {
                        row.stat_error = 1;
                        self.problems.push(format!(
                            "statvfs({mp}) on {} ({}): {e}",
                            mount.source, mount.fs_type
                        ));
                    }
                    None => continue,
                }
            }
            self.rows.push_row(time_us, &row)?;
            self.seen.push(format!("{mp} ({})", mount.fs_type));
        }
        Ok(())
    }
}

impl Collector for Filesystem {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    fn probe(&mut self) -> Availability {
        if let Err(e) = self.collect(0) {
            // No mount table is a root without one; one that reads badly is
            // probed again until it mends.
            let reason = format!("{e:#}");
            return match self.mountinfo.path().exists() {
                false => Availability::Absent(reason),
                true => Availability::Failed(reason),
            };
        }
        if self.seen.is_empty() {
            return Availability::Absent(format!(
                "no mount in {} of collectors.filesystem.fs_types or mount_points",
                self.mountinfo.path().display()
            ));
        }
        // A few dozen named; past that, a count: doctor's line for a node of
        // hundreds of volumes was every one of them.
        const NAMED: usize = 20;
        let more = match self.seen.len().saturating_sub(NAMED) {
            0 => String::new(),
            more => format!(" and {more} more"),
        };
        Availability::Available(format!(
            "{} mount{}: {}{more}",
            self.seen.len(),
            if self.seen.len() == 1 { "" } else { "s" },
            self.seen[..self.seen.len().min(NAMED)].join(", ")
        ))
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        self.problems.clear();
        self.seen.clear();
        self.errors.clear();
        let result = self.read(time_us);
        let batch = self.rows.finish();
        result?;
        Ok(if batch.is_empty() {
            vec![]
        } else {
            vec![batch]
        })
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = self.problems.clone();
        if self.over_max_mounts > 0 {
            problems.push(format!(
                "{} mounts over collectors.filesystem.max_mounts = {} are not read: raise it, or name the mounts that matter in mount_points or narrow fs_types",
                self.over_max_mounts, self.max_mounts
            ));
        }
        problems
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.errors.clone()
    }

    fn left_out(&self) -> u64 {
        self.over_max_mounts as u64
    }
}

/// Stats from a table, for fixtures: each line of the file is a mount point,
/// then either `hang`, `error <errno>`, or `<fragment size> <blocks> <free>
/// <available> <files> <files free>`. A mount not in the table is ENOENT.
/// A hang lasts until [`FixedStatFs::release`].
#[cfg(any(test, feature = "test-support"))]
pub struct FixedStatFs {
    answers: HashMap<String, Result<FsStat, Option<i32>>>,
    released: std::sync::Mutex<bool>,
    wake: std::sync::Condvar,
    /// Stats asked for so far.
    pub calls: std::sync::atomic::AtomicUsize,
}

#[cfg(any(test, feature = "test-support"))]
impl FixedStatFs {
    /// Reads the table at `path`.
    pub fn from_file(path: &Path) -> anyhow::Result<FixedStatFs> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let mut answers = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let bad = || anyhow!("{}:{}: not a statvfs line", path.display(), n + 1);
            let answer = match words.as_slice() {
                [] => continue,
                [_, "hang"] => Err(None),
                [_, "error", errno] => Err(Some(errno.parse().map_err(|_| bad())?)),
                [_, rest @ ..] if rest.len() == 6 => {
                    let n: Vec<u64> = rest
                        .iter()
                        .map(|w| w.parse().map_err(|_| bad()))
                        .collect::<anyhow::Result<_>>()?;
                    Ok(FsStat {
                        fragment_size: n[0],
                        blocks: n[1],
                        blocks_free: n[2],
                        blocks_available: n[3],
                        files: n[4],
                        files_free: n[5],
                    })
                }
                _ => return Err(bad()),
            };
            answers.insert(words[0].to_owned(), answer);
        }
        Ok(FixedStatFs {
            answers,
            released: std::sync::Mutex::new(false),
            wake: std::sync::Condvar::new(),
            calls: Default::default(),
        })
    }

    /// Lets every hung stat return (with ETIMEDOUT, as a soft NFS mount does).
    pub fn release(&self) {
        *self.released.lock().expect("not poisoned") = true;
        self.wake.notify_all();
    }
}

#[cfg(any(test, feature = "test-support"))]
impl StatFs for FixedStatFs {
    fn statvfs(&self, path: &Path) -> io::Result<FsStat> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match self.answers.get(path.to_str().unwrap_or_default()) {
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
            Some(Ok(stat)) => Ok(*stat),
            Some(Err(Some(errno))) => Err(io::Error::from_raw_os_error(*errno)),
            Some(Err(None)) => {
                let mut released = self.released.lock().expect("not poisoned");
                while !*released {
                    released = self.wake.wait(released).expect("not poisoned");
                }
                Err(io::Error::from_raw_os_error(libc::ETIMEDOUT))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::testutil::{copy_tree, node, roots, tags, u64s};

    fn fixed(node_name: &str) -> Arc<FixedStatFs> {
        Arc::new(FixedStatFs::from_file(&node(node_name).join("statvfs")).unwrap())
    }

    /// A timeout that a stat answered from the fixture's table meets on a
    /// loaded test machine too (a thread to start, a table to read); the
    /// hung mount still costs only this once.
    fn fast() -> FilesystemConfig {
        FilesystemConfig {
            stat_timeout_ms: 1000,
            ..FilesystemConfig::default()
        }
    }

    #[test]
    fn table_is_valid_and_config_checks() {
        FILESYSTEM.validate().unwrap();
        FilesystemConfig::default().validate().unwrap();
        let bad = FilesystemConfig {
            stat_timeout_ms: 0,
            ..FilesystemConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().1,
            "collectors.filesystem.stat_timeout_ms = 0: must be between 1 and 60000"
        );
        assert!(toml::from_str::<FilesystemConfig>("timeout_ms = 5\n").is_err());
        for key in ["fs_types", "mount_points", "stat_timeout_ms"] {
            assert!(KEY_DOCS.iter().any(|(k, _)| *k == key), "{key}");
        }
    }

    #[test]
    fn mountinfo_lines() {
        let text = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n\
                    90 27 0:50 / /mnt/my\\040data ro,relatime shared:7 master:1 - nfs4 srv:/ex\\134port rw,vers=4.2\n\
                    91 27 0:51 / /scratch rw - xfs /dev/md0 ro\n\
                    46 45 0:4 net:[4026532174] /run/netns/cni-1 rw shared:2 - nsfs nsfs rw\n";
        let (m, errors) = parse_mountinfo(text.as_bytes(), "mi");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(m[3].fs_type, "nsfs", "a namespace bind mount is a mount");
        assert_eq!(m[0].mount_point, "/");
        assert_eq!((m[0].fs_type.as_str(), m[0].read_only), ("ext4", false));
        assert_eq!(m[1].mount_point, "/mnt/my data");
        assert_eq!(m[1].source, "srv:/ex\\port");
        assert!(m[1].read_only);
        assert!(m[2].read_only, "a read-only superblock");
        for (bad, want) in [
            (
                "27 1 254:0 / / rw ext4 /dev/vda rw\n",
                "mi:1: no \" - \" separator",
            ),
            (
                "27 1 254:0 / - ext4 /dev/vda rw\n",
                "mi:1: fewer fields than mountinfo has",
            ),
            (
                "27 1 254:0 / / rw - ext4\n",
                "mi:1: fewer fields than mountinfo has",
            ),
            ("a b c d e f - g h i\n", "mi:1: not a mountinfo line"),
        ] {
            let (mounts, errors) = parse_mountinfo(bad.as_bytes(), "mi");
            assert!(mounts.is_empty());
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            assert_eq!(errors, [want]);
        }
        // A bad line costs its own mount: the lines around it are read.
        let mut text = b"27 1 254:0 / / rw - ext4 /dev/vda rw\n28 27 0:5 /\n".to_vec();
        text.extend_from_slice(b"29 27 0:6 / /d\xff rw - xfs /dev/vdb rw\n");
        text.extend_from_slice(b"30 27 0:7 / /data rw - xfs /dev/vdc rw\n");
        let (m, errors) = parse_mountinfo(&text, "mi");
        let points: Vec<&str> = m.iter().map(|m| m.mount_point.as_str()).collect();
        assert_eq!(points, ["/", "/data"]);
        let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            ["mi:2: no \" - \" separator", "mi:3: not UTF-8 text"]
        );
        assert_eq!(unescape("a\\040b\\"), "a b\\");
        assert_eq!(unescape("\\777"), "\\777", "not a byte: kept as written");
    }

    #[test]
    fn vm_node_reads_its_root_filesystem_only() {
        let mut c = Filesystem::with_statfs(&fast(), &roots(&node("vm-node")), fixed("vm-node"));
        match c.probe() {
            Availability::Available(s) => assert_eq!(s, "1 mount: / (ext4)"),
            other => panic!("{other:?}"),
        }
        let batches = c.collect(1).unwrap();
        let rows = &batches[0];
        assert_eq!(tags(rows, "device"), ["/dev/vda"]);
        assert_eq!(u64s(rows, "size_bytes"), [Some(66_053_021 * 4096)]);
        assert_eq!(u64s(rows, "avail_bytes"), [Some(15_035_450 * 4096)]);
        assert_eq!(u64s(rows, "files_free"), [Some(16_341_564)]);
        assert_eq!(u64s(rows, "stat_hung"), [Some(0)]);
        assert!(c.problems().is_empty());
    }

    /// The hung NFS mount of the bare-metal fixture: the tick returns within
    /// its timeout, reports the hang, does not ask again while the stat is
    /// stuck, and reads the mount again once it returns.
    #[test]
    fn a_hung_mount_never_hangs_the_collector() {
        let statfs = fixed("baremetal-node");
        let mut c =
            Filesystem::with_statfs(&fast(), &roots(&node("baremetal-node")), statfs.clone());
        let started = Instant::now();
        let batches = c.collect(1).unwrap();
        let took = started.elapsed();
        // The hang lasts until released: well past the timeout is waiting on it.
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(
            took >= Duration::from_millis(1000),
            "waited for the timeout: {took:?}"
        );
        let rows = &batches[0];
        let mps = tags(rows, "mount_point");
        assert_eq!(
            mps,
            [
                "/",
                "/boot/efi",
                "/raid",
                "/lustre",
                "/mnt/checkpoints",
                "/home"
            ]
        );
        assert_eq!(u64s(rows, "stat_hung"), [0, 0, 0, 0, 1, 0].map(Some));
        assert_eq!(u64s(rows, "stat_error"), [0, 0, 0, 0, 0, 1].map(Some));
        assert_eq!(u64s(rows, "size_bytes")[4], None);
        assert_eq!(u64s(rows, "read_only")[3], Some(0));
        assert!(u64s(rows, "size_bytes")[3].is_some(), "lustre answered");
        let problems = c.problems().join("\n");
        assert!(
            problems.contains(
                "statvfs(/mnt/checkpoints) on 10.20.0.5:/checkpoints (nfs4) has not returned"
            ),
            "{problems}"
        );
        assert!(
            problems.contains("statvfs(/home) on 10.20.0.6:/home (nfs4): Stale file handle"),
            "{problems}"
        );
        assert_eq!(c.hung(), 1);
        let calls = statfs.calls.load(Ordering::SeqCst);
        assert_eq!(calls, 6);

        // Later ticks do not wait on it nor ask it again: no threads pile up.
        for tick in 2..6 {
            let started = Instant::now();
            let batches = c.collect(tick).unwrap();
            assert!(
                // No wait for the 1 s timeout; the call count below says
                // no stat was asked either. Room for a loaded test machine.
                started.elapsed() < Duration::from_secs(2),
                "{:?}",
                started.elapsed()
            );
            assert_eq!(u64s(&batches[0], "stat_hung")[4], Some(1));
        }
        assert_eq!(
            statfs.calls.load(Ordering::SeqCst),
            calls + 4 * 5,
            "one stat per healthy mount per tick, none for the hung one"
        );
        assert_eq!(c.hung(), 1);

        // The server comes back: the stat returns, the next tick asks afresh.
        statfs.release();
        std::thread::sleep(Duration::from_millis(50));
        let batches = c.collect(7).unwrap();
        // Asked afresh; released, the fixture's hang now times out as a
        // soft NFS mount does: an error, no longer a hang.
        assert_eq!(u64s(&batches[0], "stat_hung")[4], Some(0));
        assert_eq!(u64s(&batches[0], "stat_error")[4], Some(1));
        assert_eq!(c.hung(), 0);
        assert!(
            c.problems()
                .iter()
                .any(|p| p.contains("statvfs(/mnt/checkpoints)") && p.contains("timed out")),
            "{:?}",
            c.problems()
        );
    }

    /// A hung mount gone from the mount table for a tick and back is still
    /// the hung one: no stat is asked of it again (each return had parked
    /// one more thread on the same hung filesystem); a new mount on its
    /// point (another id) is another mount.
    #[test]
    fn a_hung_mount_that_leaves_the_table_and_returns_is_not_asked_again() {
        let dir = tempfile::tempdir().unwrap();
        crate::testutil::copy_tree(&node("baremetal-node"), dir.path());
        let mountinfo = dir.path().join("proc/self/mountinfo");
        let table = std::fs::read_to_string(&mountinfo).unwrap();
        let without: String = table
            .lines()
            .filter(|l| !l.contains(" /mnt/checkpoints "))
            .map(|l| format!("{l}\n"))
            .collect();
        let statfs = fixed("baremetal-node");
        let mut c = Filesystem::with_statfs(&fast(), &roots(dir.path()), statfs.clone());
        c.collect(1).unwrap();
        assert_eq!(c.hung(), 1);
        let calls = statfs.calls.load(Ordering::SeqCst);
        // Written in place: the collector holds the file open.
        std::fs::write(&mountinfo, &without).unwrap();
        c.collect(2).unwrap();
        std::fs::write(&mountinfo, &table).unwrap();
        let batches = c.collect(3).unwrap();
        let at = tags(&batches[0], "mount_point")
            .iter()
            .position(|m| m == "/mnt/checkpoints")
            .unwrap();
        assert_eq!(u64s(&batches[0], "stat_hung")[at], Some(1));
        assert_eq!(c.hung(), 1, "one stat hung, not one more");
        assert_eq!(
            statfs.calls.load(Ordering::SeqCst),
            calls + 5 + 5,
            "the five healthy mounts twice, the hung one not again"
        );
        // Mounted anew on the same point: a mount of its own, asked.
        std::fs::write(&mountinfo, table.replace("421 26 0:61 / /mnt/checkpoints", "999 26 0:99 / /mnt/checkpoints")).unwrap();
        c.collect(4).unwrap();
        assert_eq!(statfs.calls.load(Ordering::SeqCst), calls + 5 + 5 + 6);
        statfs.release();
    }

    /// Answers every stat at once and records which thread made it.
    #[derive(Default)]
    struct ThreadRecorder {
        seen: std::sync::Mutex<Vec<(PathBuf, std::thread::ThreadId)>>,
    }

    impl StatFs for ThreadRecorder {
        fn statvfs(&self, path: &Path) -> io::Result<FsStat> {
            let me = std::thread::current().id();
            self.seen.lock().unwrap().push((path.to_owned(), me));
            Ok(FsStat {
                fragment_size: 4096,
                blocks: 100,
                blocks_free: 50,
                blocks_available: 40,
                files: 10,
                files_free: 5,
            })
        }
    }

    /// Each mount is stat'ed on a thread of its own, the same one tick after
    /// tick, and a mount that goes away takes its thread with it.
    #[test]
    fn each_mount_keeps_one_stat_thread_from_tick_to_tick() {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&node("baremetal-node").join("proc"), &dir.path().join("proc"));
        let recorder = Arc::new(ThreadRecorder::default());
        let statfs: Arc<dyn StatFs> = recorder.clone();
        let mut c = Filesystem::with_statfs(&fast(), &roots(dir.path()), statfs.clone());
        for tick in 0..5 {
            let batches = c.collect(tick).unwrap();
            assert_eq!(u64s(&batches[0], "size_bytes"), [Some(409_600); 6]);
        }
        let seen = recorder.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 6 * 5, "one stat per mount per tick");
        let mut threads: HashMap<PathBuf, std::collections::HashSet<std::thread::ThreadId>> =
            HashMap::new();
        for (path, thread) in &seen {
            threads.entry(path.clone()).or_default().insert(*thread);
        }
        assert_eq!(threads.len(), 6);
        assert!(threads.values().all(|t| t.len() == 1), "{threads:?}");
        let distinct: std::collections::HashSet<_> = threads.values().flatten().collect();
        assert_eq!(distinct.len(), 6, "the mounts do not share a thread");
        // Each living stat thread holds the stat: the test's two, the
        // collector's, and one a mount.
        assert_eq!(Arc::strong_count(&statfs), 3 + 6);

        // Every mount but the root goes away: their threads end.
        let mountinfo = dir.path().join("proc/self/mountinfo");
        let text = std::fs::read_to_string(&mountinfo).unwrap();
        let root: String = text.lines().filter(|l| l.contains(" / / ")).collect();
        std::fs::write(&mountinfo, format!("{root}\n")).unwrap();
        let batches = c.collect(5).unwrap();
        assert_eq!(tags(&batches[0], "mount_point"), ["/"]);
        let waited = Instant::now();
        while Arc::strong_count(&statfs) > 4 && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(Arc::strong_count(&statfs), 4);
        drop(c);
        let waited = Instant::now();
        while Arc::strong_count(&statfs) > 2 && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(Arc::strong_count(&statfs), 2, "the collector gone, so are its threads");
    }

    /// In a container with the host's `/` at `/host`: the host's mounts come
    /// from its init's mount table, each is stat'ed under `/host` and reported
    /// by its host path; the container's own mounts are not read.
    #[test]
    fn a_moved_rootfs_reads_the_hosts_mounts_under_it() {
        let dir = tempfile::tempdir().unwrap();
        for pid in ["self", "1"] {
            std::fs::create_dir_all(dir.path().join("proc").join(pid)).unwrap();
        }
        std::fs::write(
            dir.path().join("proc/self/mountinfo"),
            "500 400 0:60 / / rw - overlay overlay rw\n\
             501 500 254:1 / /host ro master:1 - ext4 /dev/vda1 rw\n\
             502 500 254:2 /scratch /scratch rw - xfs /dev/vdb rw\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("proc/1/mountinfo"),
            "27 1 254:1 / / rw - ext4 /dev/vda1 rw\n\
             28 27 259:0 / /data rw,noatime - xfs /dev/nvme0n1 rw\n\
             29 27 0:5 / /dev/shm rw - tmpfs tmpfs rw\n",
        )
        .unwrap();
        let table = dir.path().join("statvfs");
        std::fs::write(
            &table,
            "/host 4096 1000 400 300 5000 4000\n\
             /host/data 4096 9000 8000 7000 60000 50000\n\
             / 4096 1 1 1 1 1\n\
             /data 4096 2 2 2 2 2\n\
             /scratch 4096 3 3 3 3 3\n",
        )
        .unwrap();
        let statfs = Arc::new(FixedStatFs::from_file(&table).unwrap());
        let mut moved = roots(dir.path());
        moved.rootfs = "/host".into();
        let mut c = Filesystem::with_statfs(&fast(), &moved, statfs.clone());
        let batches = c.collect(1).unwrap();
        let rows = &batches[0];
        assert_eq!(tags(rows, "mount_point"), ["/", "/data"]);
        assert_eq!(tags(rows, "device"), ["/dev/vda1", "/dev/nvme0n1"]);
        assert_eq!(
            u64s(rows, "size_bytes"),
            [Some(1000 * 4096), Some(9000 * 4096)]
        );
        assert_eq!(u64s(rows, "files_free"), [Some(4000), Some(50000)]);
        assert!(c.problems().is_empty(), "{:?}", c.problems());

        // The same tree without a moved rootfs is the container's own view.
        let mut own = Filesystem::with_statfs(&fast(), &roots(dir.path()), statfs);
        let batches = own.collect(1).unwrap();
        assert_eq!(tags(&batches[0], "mount_point"), ["/host", "/scratch"]);
    }

    /// A mount table of 300 volumes of a wanted type, one of them hidden by
    /// a tmpfs mounted over it: the first `max_mounts` visible ones are read
    /// and the rest left out, counted and named as a problem.
    #[test]
    fn mounts_over_max_mounts_are_left_out_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/self")).unwrap();
        let mut table = String::from("27 1 254:1 / / rw - ext4 /dev/vda1 rw\n");
        let mut answers = String::from("/ 4096 10 5 5 100 50\n");
        for i in 0..300 {
            table.push_str(&format!(
                "{} 27 254:{i} / /volumes/v{i} rw - ext4 /dev/v{i} rw\n",
                100 + i
            ));
            answers.push_str(&format!("/volumes/v{i} 4096 10 5 5 100 50\n"));
        }
        table.push_str("999 27 0:9 / /volumes/v1 rw - tmpfs tmpfs rw\n");
        std::fs::write(dir.path().join("proc/self/mountinfo"), table).unwrap();
        let statvfs = dir.path().join("statvfs");
        std::fs::write(&statvfs, answers).unwrap();
        let statfs = Arc::new(FixedStatFs::from_file(&statvfs).unwrap());
        let config = FilesystemConfig {
            max_mounts: 256,
            ..fast()
        };
        let mut c = Filesystem::with_statfs(&config, &roots(dir.path()), statfs);
        let batches = c.collect(1).unwrap();
        let points = tags(&batches[0], "mount_point");
        assert_eq!(points.len(), 256);
        assert_eq!(&points[..3], ["/", "/volumes/v0", "/volumes/v2"]);
        assert_eq!(points[255], "/volumes/v255");
        // 299 volumes seen (v1 is hidden) and the root: 44 over the cap.
        assert_eq!(c.left_out(), 44);
        let problems = c.problems();
        assert!(
            problems.len() == 1 && problems[0].starts_with("44 mounts over collectors.filesystem.max_mounts = 256"),
            "{problems:?}"
        );
        let mut roomy = Filesystem::with_statfs(
            &FilesystemConfig {
                max_mounts: 1000,
                ..fast()
            },
            &roots(dir.path()),
            Arc::new(FixedStatFs::from_file(&statvfs).unwrap()),
        );
        let all = roomy.collect(1).unwrap();
        assert_eq!(tags(&all[0], "mount_point").len(), 300);
        assert!(!tags(&all[0], "mount_point").contains(&"/volumes/v1".to_string()));
        assert_eq!(roomy.left_out(), 0);
        match roomy.probe() {
            Availability::Available(found) => assert!(
                found.starts_with("300 mounts: / (ext4), /volumes/v0 (ext4)")
                    && found.ends_with("/volumes/v19 (ext4) and 280 more"),
                "{found}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(roomy.problems().is_empty());
        let zero = FilesystemConfig {
            max_mounts: 0,
            ..FilesystemConfig::default()
        };
        assert_eq!(zero.validate().unwrap_err().0, "collectors.filesystem.max_mounts");
    }

    #[test]
    fn mount_points_select_whatever_their_type() {
        let config = FilesystemConfig {
            mount_points: vec!["/raid".into(), "/dev/shm".into(), "/nowhere".into()],
            ..fast()
        };
        let mut c = Filesystem::with_statfs(
            &config,
            &roots(&node("baremetal-node")),
            fixed("baremetal-node"),
        );
        let batches = c.collect(1).unwrap();
        assert_eq!(tags(&batches[0], "mount_point"), ["/dev/shm", "/raid"]);
        assert_eq!(tags(&batches[0], "fs_type"), ["tmpfs", "xfs"]);
        assert_eq!(u64s(&batches[0], "size_bytes")[0], Some(270_532_608 * 4096));
    }

    /// A junk line of the mount table (issue 36, item 6) costs only its own
    /// mount: every other mount is read with its values, the line is named in
    /// `source_errors`, and the collector stays available. Only a table with
    /// no good line fails the tick.
    #[test]
    fn garbage_costs_only_its_line() {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(
            &node("baremetal-node").join("proc/self"),
            &dir.path().join("proc/self"),
        );
        let path = dir.path().join("proc/self/mountinfo");
        let good = std::fs::read_to_string(&path).unwrap();
        let statfs = fixed("baremetal-node");
        let mut c = Filesystem::with_statfs(&fast(), &roots(dir.path()), statfs.clone());
        let intact = c.collect(1).unwrap();
        // /raid's line cut short, as a kernel never writes it.
        let raid = good.lines().position(|l| l.contains(" /raid ")).unwrap();
        let damaged: Vec<String> = good
            .lines()
            .enumerate()
            .map(|(i, l)| {
                if i == raid {
                    l[..l.len() / 3].to_string()
                } else {
                    l.to_string()
                }
            })
            .collect();
        std::fs::write(&path, damaged.join("\n") + "\n").unwrap();
        assert!(matches!(c.probe(), Availability::Available(_)));
        let batches = c.collect(2).unwrap();
        let (was, now) = (&intact[0], &batches[0]);
        let mut want = tags(was, "mount_point");
        want.retain(|m| m != "/raid");
        assert_eq!(tags(now, "mount_point"), want);
        for field in ["size_bytes", "avail_bytes", "files_free", "stat_error"] {
            let mut values = u64s(was, field);
            values.remove(
                tags(was, "mount_point")
                    .iter()
                    .position(|m| m == "/raid")
                    .unwrap(),
            );
            assert_eq!(u64s(now, field), values, "{field}");
        }
        let errors: Vec<String> = c.source_errors().iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(&format!("{}:{}: ", path.display(), raid + 1)),
            "{errors:?}"
        );
        std::fs::write(&path, &good).unwrap();
        assert_eq!(c.collect(3).unwrap()[0].len(), was.len(), "mended");
        assert!(c.source_errors().is_empty());
        statfs.release();
    }

    #[test]
    fn a_table_with_no_good_line_fails_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/self")).unwrap();
        let path = dir.path().join("proc/self/mountinfo");
        std::fs::write(&path, "28 27 0:5 /\n").unwrap();
        let mut c = Filesystem::with_statfs(&fast(), &roots(dir.path()), fixed("vm-node"));
        let err = c.collect(1).unwrap_err().to_string();
        assert_eq!(err, format!("{}:1: no \" - \" separator", path.display()));
        // Probed again until it mends, not off until a restart.
        assert!(matches!(c.probe(), Availability::Failed(_)));
        std::fs::write(&path, b"27 1 254:0 / / rw - ext4 /dev/\xff rw\n").unwrap();
        assert!(c
            .collect(2)
            .unwrap_err()
            .to_string()
            .ends_with(":1: not UTF-8 text"));
        std::fs::write(&path, "27 1 254:0 / / rw - ext4 /dev/vda rw\n").unwrap();
        assert_eq!(c.collect(3).unwrap()[0].len(), 1, "recovers");
        assert!(matches!(c.probe(), Availability::Available(_)));
        std::fs::remove_file(&path).unwrap();
        let mut c = Filesystem::with_statfs(&fast(), &roots(dir.path()), fixed("vm-node"));
        let Availability::Absent(why) = c.probe() else {
            panic!("absent without mountinfo")
        };
        assert!(why.contains("mountinfo: No such file"), "{why}");
    }

    #[test]
    fn the_real_statvfs_answers_for_the_root() {
        let s = SystemStatFs.statvfs(Path::new("/")).unwrap();
        assert!(s.fragment_size > 0 && s.blocks > 0 && s.blocks_available <= s.blocks);
        let e = SystemStatFs
            .statvfs(Path::new("/nonexistent/vtax"))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
