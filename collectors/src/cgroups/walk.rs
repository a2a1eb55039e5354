//! The walk: which cgroups are read (depth, include and exclude patterns, the
//! cardinality bound), what kind of workload each holds, and which are leaves.

use super::*;

/// A file of a cgroup, and whether it turned out to be absent since the last walk.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) source: Source,
    /// Held open between ticks (measurements) or opened, read and closed at
    /// each rescan (settings).
    pub(super) file: KeptFile,
    pub(super) absent: bool,
    /// Whether a read through the held descriptor succeeded: an error after
    /// that may be a cgroup made again at the same path, worth one fresh open.
    pub(super) kept: bool,
    /// The inode of the cgroup's directory in this hierarchy when the walk
    /// found it: a descriptor is kept across walks only for the same one. A
    /// v1 cgroup renamed and another made under its name are two cgroups at
    /// one path in turn, and the kept descriptor reads the renamed one.
    pub(super) dir_ino: u64,
}

/// A cgroup to sample.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) path: String,
    pub(super) workload: &'static str,
    pub(super) slots: Vec<Slot>,
    /// Whether a deleted file must be noticed with `fstat` (not on cgroupfs).
    pub(super) check_deleted: bool,
    /// `cpu_quota_cpus` and `memory_limit_bytes` as read at the last rescan.
    pub(super) quota: Option<f64>,
    pub(super) limit: Option<u64>,
    /// Whether v1 `cpu.cfs_quota_us` was readable at the last rescan (then
    /// the cgroup has a row even when nothing else is readable).
    pub(super) quota_read: bool,
    /// The row of the last tick that read every file; `None` until one has,
    /// and after a tick where one of its files read badly.
    pub(super) last_full: Option<CgroupRow<'static>>,
    /// Whether a limit file read badly at the last settings read: read again
    /// at the next tick rather than at the next walk.
    pub(super) settings_failed: bool,
}

impl Target {
    /// Whether `row` (read without the usage-following files) shows the cgroup
    /// as it was at its last full read: the same CPU time and memory charge,
    /// both read. Without either there is nothing to tell quiet by.
    pub(super) fn quiet(&self, row: &Row) -> bool {
        let Some(last) = &self.last_full else {
            return false;
        };
        let now = &row.values;
        now.cpu_usage_seconds.is_some()
            && now.cpu_usage_seconds == last.cpu_usage_seconds
            && now.memory_usage_bytes.is_some()
            && now.memory_usage_bytes == last.memory_usage_bytes
    }
}

/// What a walk found.
#[derive(Debug, Default)]
pub(super) struct Discovery {
    pub(super) targets: Vec<Target>,
    /// Cgroups within depth that passed the patterns but were over `max_cgroups`.
    pub(super) skipped: usize,
    /// Directories whose names are not UTF-8, left out with what is below them.
    pub(super) not_utf8: usize,
}

/// Which cgroups are sampled: those within `max_depth` of the root that pass
/// the include and exclude patterns, at most `max_cgroups` of them: those
/// sampled before first, then shallowest first, then by path. The perf
/// collector selects with the same rules, so its rows name cgroups the
/// cgroups collector names too, under the same bound.
pub(in crate) struct Selection {
    pub(super) filter: Filter,
    pub(super) max_depth: u32,
    pub(super) max_cgroups: usize,
    pub(super) rescan_us: i64,
}

impl Selection {
    pub(in crate) fn new(config: &CgroupsConfig) -> Selection {
        Selection {
            filter: Filter::new(config),
            max_depth: config.max_depth.max(1),
            max_cgroups: config.max_cgroups.max(1) as usize,
            rescan_us: (config.rescan_interval_secs.max(0.0) * 1e6) as i64,
        }
    }

    /// Every cgroup below each of `dirs` (hierarchy roots), down to
    /// `max_depth`: its path relative to the root (`/a/b`) to the indexes of
    /// the dirs that have it, each with the inode of its directory there;
    /// and how many directories were left out, with
    /// what is below them, for a name that is not UTF-8 (a path is a label).
    /// `visit` is shown each directory (the roots and every cgroup found)
    /// before it is listed.
    pub(in crate) fn list(
        &self,
        dirs: &[&Path],
        visit: &mut dyn FnMut(&Path),
    ) -> (BTreeMap<String, Vec<(usize, u64)>>, usize) {
        use std::os::unix::fs::DirEntryExt;
        let mut out: BTreeMap<String, Vec<(usize, u64)>> = BTreeMap::new();
        // By parent and name: a cgroup is in each v1 hierarchy, counted once.
        let mut not_utf8: std::collections::BTreeSet<(String, std::ffi::OsString)> =
            std::collections::BTreeSet::new();
        for (idx, root) in dirs.iter().enumerate() {
            let mut stack: Vec<(String, PathBuf, u32, u64)> =
                vec![(String::new(), root.to_path_buf(), 0, 0)];
            while let Some((rel, dir, depth, ino)) = stack.pop() {
                visit(&dir);
                if depth > 0 {
                    out.entry(rel.clone()).or_default().push((idx, ino));
                }
                if depth >= self.max_depth {
                    continue;
                }
                // A directory gone since its parent was listed is churn; one we
                // may not read is left out.
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    let name = match entry.file_name().into_string() {
                        Ok(name) => name,
                        Err(name) => {
                            not_utf8.insert((rel.clone(), name)); // cannot be a tag
                            continue;
                        }
                    };
                    stack.push((format!("{rel}/{name}"), entry.path(), depth + 1, entry.ino()));
                }
            }
        }
        (out, not_utf8.len())
    }

    /// The listed cgroups the patterns accept, cut to `max_cgroups`: those
    /// `sampled` by the walk before first, then shallowest first (which keeps
    /// slices over the leaves under them), then by path; and how many the
    /// cut left out. A cgroup made past the bound is left out rather than
    /// pushing out one already sampled: a cut that moved would turn a steady
    /// pod into a leaf with its children's use, or move a steady container's
    /// use outside every sampled cgroup, each a rise that nobody made.
    pub(in crate) fn bound<T>(
        &self,
        listed: impl IntoIterator<Item = (String, T)>,
        sampled: impl Fn(&str) -> bool,
    ) -> (Vec<(String, T)>, usize) {
        let mut paths: Vec<(String, T)> = listed
            .into_iter()
            .filter(|(path, _)| self.filter.accepts(path))
            .collect();
        paths.sort_by_cached_key(|(path, _)| (!sampled(path), depth_of(path), path.clone()));
        let skipped = paths.len().saturating_sub(self.max_cgroups);
        paths.truncate(self.max_cgroups);
        (paths, skipped)
    }

    /// Whether a walk is due at `time_us` after one at `walked_at` (`None`:
    /// never walked, or a cgroup vanished since).
    pub(in crate) fn rescan_due(&self, walked_at: Option<i64>, time_us: i64) -> bool {
        due(walked_at, time_us, self.rescan_us)
    }

    /// `rescan_interval_secs`, as configured (never below 0).
    pub(super) fn rescan_interval_secs(&self) -> f64 {
        self.rescan_us as f64 / 1e6
    }

    /// Why nothing is sampled, when the patterns do not compile.
    pub(in crate) fn broken(&self) -> Option<&str> {
        self.filter.broken.as_deref()
    }

    pub(in crate) fn max_depth(&self) -> u32 {
        self.max_depth
    }

    pub(in crate) fn max_cgroups(&self) -> usize {
        self.max_cgroups
    }
}

/// Whether something last done at `last` (`None`: never) is due again at
/// `time_us`, every `interval_us`; a clock stepped back makes it due.
pub(super) fn due(last: Option<i64>, time_us: i64, interval_us: i64) -> bool {
    match last {
        None => true,
        Some(at) => time_us < at || time_us - at >= interval_us,
    }
}

pub(super) fn depth_of(path: &str) -> usize {
    path.bytes().filter(|&b| b == b'/').count()
}

/// Walks the hierarchies; with a `watch`, every directory listed is watched
/// first. A watch that could not take every directory is dropped (one that
/// misses some would miss their changes) and the reason returned. `before`
/// is the previous walk's, whose cgroups the bound keeps first.
pub(super) fn walk(
    layout: &Layout,
    selection: &Selection,
    watch: &mut Option<CgroupWatch>,
    before: &Discovery,
) -> (Discovery, Option<String>) {
    let dirs: Vec<&Path> = layout.hierarchies.iter().map(|h| h.dir.as_path()).collect();
    let mut watch_failed = None;
    let (found, not_utf8) = selection.list(&dirs, &mut |dir| {
        if let Some(w) = watch.as_mut() {
            if let Err(e) = w.add(dir) {
                watch_failed = Some(e);
                *watch = None;
            }
        }
    });
    // Pressure-only paths (hybrid `unified/`) are not workloads of their own.
    let pressure_only = |idxs: &[(usize, u64)]| {
        idxs.iter()
            .all(|&(i, _)| layout.hierarchies[i].sources.as_slice() == PRESSURE_SOURCES)
    };
    let (paths, skipped) = selection.bound(
        found
            .into_iter()
            .filter(|(_, idxs)| layout.unified || !pressure_only(idxs)),
        |path| {
            before
                .targets
                .binary_search_by(|t| t.path.as_str().cmp(path))
                .is_ok()
        },
    );
    let mut targets: Vec<Target> = paths
        .into_iter()
        .map(|(path, idxs)| {
            let mut slots = Vec::new();
            let mut check_deleted = false;
            for (i, dir_ino) in idxs {
                let hierarchy = &layout.hierarchies[i];
                let dir = hierarchy.dir.join(path.trim_start_matches('/'));
                check_deleted |= !hierarchy.cgroupfs;
                for &source in &hierarchy.sources {
                    slots.push(Slot {
                        source,
                        file: KeptFile::new(dir.join(source.file_name())),
                        absent: false,
                        kept: false,
                        dir_ino,
                    });
                }
            }
            Target {
                workload: classify(&path),
                path,
                slots,
                check_deleted,
                quota: None,
                limit: None,
                quota_read: false,
                last_full: None,
                settings_failed: false,
            }
        })
        .collect();
    // Rows in path order: stable from tick to tick, easy to read.
    targets.sort_by(|a, b| a.path.cmp(&b.path));
    (
        Discovery {
            targets,
            skipped,
            not_utf8,
        },
        watch_failed,
    )
}

/// Moves the descriptors held for `old`'s cgroups into the same files of
/// `new`'s (both in path order), so that a walk opens only what it newly found.
pub(super) fn keep_open(new: &mut [Target], old: Vec<Target>) {
    let mut old = old.into_iter().peekable();
    for target in new {
        while old.next_if(|o| o.path < target.path).is_some() {}
        let Some(mut prev) = old.next_if(|o| o.path == target.path) else {
            continue;
        };
        for (i, slot) in target.slots.iter_mut().enumerate() {
            if slot.source.is_setting() {
                continue;
            }
            let same = |p: &Slot| p.file.path() == slot.file.path() && p.dir_ino == slot.dir_ino;
            let found = match prev.slots.get(i) {
                Some(p) if same(p) => Some(i),
                _ => prev.slots.iter().position(same),
            };
            if let Some(j) = found {
                std::mem::swap(&mut slot.file, &mut prev.slots[j].file);
                slot.kept = prev.slots[j].kept;
            }
        }
    }
}

/// Include and exclude patterns, compiled once.
pub(super) struct Filter {
    pub(super) include: RegexSet,
    pub(super) exclude: RegexSet,
    /// Set when the patterns did not compile: nothing is sampled.
    pub(super) broken: Option<String>,
}

impl Filter {
    pub(super) fn new(config: &CgroupsConfig) -> Filter {
        let include = compile("collectors.cgroups.include", &config.include);
        let exclude = compile("collectors.cgroups.exclude", &config.exclude);
        match (include, exclude) {
            (Ok(include), Ok(exclude)) => Filter {
                include,
                exclude,
                broken: None,
            },
            (Err(e), _) | (_, Err(e)) => Filter {
                include: RegexSet::empty(),
                exclude: RegexSet::empty(),
                broken: Some(e),
            },
        }
    }

    pub(super) fn accepts(&self, path: &str) -> bool {
        self.broken.is_none()
            && (self.include.is_empty() || self.include.is_match(path))
            && !self.exclude.is_match(path)
    }
}

/// The cgroups among `paths` with no descendant among them: where workloads
/// run, since a parent's usage and stalls hold its children's.
pub fn leaves(paths: &[&str]) -> BTreeSet<String> {
    let sorted: BTreeSet<&str> = paths.iter().copied().collect();
    sorted
        .iter()
        .filter(|p| {
            let prefix = format!("{}/", p.trim_end_matches('/'));
            !sorted
                .range(prefix.as_str()..)
                .next()
                .is_some_and(|next| next.starts_with(&prefix))
        })
        .map(|p| p.to_string())
        .collect()
}

/// How container runtimes name a container's systemd scope:
/// `<prefix><64 hex digits>.scope`.
pub const CONTAINER_SCOPE_PREFIXES: &[&str] = &[
    "docker-",
    "cri-containerd-",
    "crio-",
    "libpod-",
    "containerd-",
];

/// The kind of workload a cgroup holds, from its path alone.
pub fn classify(path: &str) -> &'static str {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let Some((&last, ancestors)) = parts.split_last() else {
        return "other";
    };
    let parent = ancestors.last().copied();
    let is_job = |c: &str| {
        c.strip_prefix("job_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if ancestors
        .iter()
        .any(|c| *c == "slurm" || c.starts_with("slurmstepd"))
    {
        if is_job(last) {
            return "slurm_job";
        }
        if ancestors.iter().any(|c| is_job(c)) {
            return "slurm_step";
        }
    }
    let is_pod = |c: &str| {
        (c.starts_with("pod") && c.len() > 3) || (c.contains("-pod") && c.ends_with(".slice"))
    };
    if ancestors.iter().any(|c| c.starts_with("kubepods")) {
        if is_pod(last) {
            return "pod";
        }
        if parent.is_some_and(is_pod) {
            return "container";
        }
    }
    if let Some(scope) = last.strip_suffix(".scope") {
        let runtime = CONTAINER_SCOPE_PREFIXES
            .iter()
            .any(|p| scope.starts_with(p));
        if runtime && !scope.contains("conmon") {
            return "container";
        }
    }
    let is_hex_id = last.len() >= 12 && last.bytes().all(|b| b.is_ascii_hexdigit());
    if is_hex_id
        && matches!(
            parent,
            Some("docker" | "containerd" | "lxc" | "libpod_parent")
        )
    {
        return "container";
    }
    if last.ends_with(".slice") {
        "slice"
    } else if last.ends_with(".service") {
        "service"
    } else {
        "other"
    }
}
