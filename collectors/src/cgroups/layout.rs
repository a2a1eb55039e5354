//! Which cgroup layout a node has (v2, v1 with or without the unified tree)
//! and where each controller's hierarchy is mounted.

use super::*;

/// A hierarchy to walk: v2's root, or one v1 controller mount.
#[derive(Clone, Debug)]
pub(super) struct Hierarchy {
    /// Its directory under `<sysfs>/fs/cgroup`.
    pub(super) dir: PathBuf,
    /// Its name for the doctor (`cpu,cpuacct`, `memory`, `unified`).
    pub(super) name: String,
    /// The files each of its cgroups is read from.
    pub(super) sources: Vec<Source>,
    /// Whether it is a cgroup filesystem, where a file of a removed cgroup
    /// answers ENODEV; in a plain directory tree (a fixture) a deleted file
    /// stays readable through its descriptor and has to be noticed by `fstat`.
    pub(super) cgroupfs: bool,
}

/// Whether `dir` is on a cgroup filesystem (v1 or v2).
pub(in crate) fn on_cgroupfs(dir: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs reads a NUL-terminated path and fills the struct we pass.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut stat) } != 0 {
        return false;
    }
    matches!(
        stat.f_type,
        libc::CGROUP_SUPER_MAGIC | libc::CGROUP2_SUPER_MAGIC
    )
}

/// What is mounted under `<sysfs>/fs/cgroup`.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    /// Whether it is the unified hierarchy (v2).
    pub(super) unified: bool,
    /// v2: the controllers the root offers.
    pub(super) controllers: String,
    /// The hierarchies to walk; v2 has one.
    pub(super) hierarchies: Vec<Hierarchy>,
}

impl Layout {
    /// The names of the limit files read at each walk.
    pub(super) fn limit_files(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self
            .hierarchies
            .iter()
            .flat_map(|h| &h.sources)
            .filter(|s| s.is_setting())
            .map(|s| s.file_name())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

pub(super) fn detect(root: &Path) -> Result<Layout, String> {
    let controllers = root.join("cgroup.controllers");
    // Its presence makes the root v2; its text is only shown by the doctor.
    if let Ok(bytes) = std::fs::read(&controllers) {
        let text = String::from_utf8_lossy(&bytes);
        return Ok(Layout {
            unified: true,
            controllers: text.split_ascii_whitespace().collect::<Vec<_>>().join(" "),
            hierarchies: vec![Hierarchy {
                dir: root.to_path_buf(),
                name: "unified".into(),
                sources: V2_SOURCES.to_vec(),
                cgroupfs: on_cgroupfs(root),
            }],
        });
    }
    let entries = std::fs::read_dir(root)
        .map_err(|e| format!("no cgroup filesystem at {}: {e}", root.display()))?;
    // (is a link, name): real mounts before the links to them.
    let mut names: Vec<(bool, String)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let link = e.file_type().is_ok_and(|t| t.is_symlink());
            e.file_name().into_string().ok().map(|n| (link, n))
        })
        .collect();
    names.sort();
    // `cpu` and `cpuacct` are usually links to `cpu,cpuacct`: walk each mount
    // once, with the controllers of every name it goes by.
    let mut mounts: Vec<PathBuf> = Vec::new();
    let mut hierarchies: Vec<Hierarchy> = Vec::new();
    let mut pressure = None;
    for (_, name) in names {
        let dir = root.join(&name);
        if !dir.is_dir() {
            continue;
        }
        if name == "unified" {
            if dir.join("cgroup.controllers").is_file() {
                pressure = Some(Hierarchy {
                    cgroupfs: on_cgroupfs(&dir),
                    dir,
                    name,
                    sources: PRESSURE_SOURCES.to_vec(),
                });
            }
            continue;
        }
        let mut sources = Vec::new();
        for controller in name.split(',') {
            match controller {
                "cpu" => sources.extend_from_slice(CPU_SOURCES),
                "cpuacct" => sources.extend_from_slice(CPUACCT_SOURCES),
                "memory" => sources.extend_from_slice(MEMORY_SOURCES),
                _ => {}
            }
        }
        if sources.is_empty() {
            continue;
        }
        let canonical = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
        if let Some(i) = mounts.iter().position(|m| *m == canonical) {
            let known = &mut hierarchies[i].sources;
            for source in sources {
                if !known.contains(&source) {
                    known.push(source);
                }
            }
            continue;
        }
        mounts.push(canonical);
        hierarchies.push(Hierarchy {
            cgroupfs: on_cgroupfs(&dir),
            dir,
            name,
            sources,
        });
    }
    if hierarchies.is_empty() {
        return Err(format!(
            "no cgroup filesystem at {}: neither cgroup.controllers (v2) nor a cpu, cpuacct or memory hierarchy (v1)",
            root.display()
        ));
    }
    hierarchies.extend(pressure);
    Ok(Layout {
        unified: false,
        controllers: String::new(),
        hierarchies,
    })
}
