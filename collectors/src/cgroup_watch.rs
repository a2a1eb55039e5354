//! Tells the cgroups collector when a walk of the hierarchy would find
//! something new, so that it walks then instead of on a timer.
//!
//! A walk lists every directory within the configured depth of every
//! hierarchy (on cgroupfs a listing returns each cgroup's control files
//! too) and opens, reads and closes each cgroup's limit files: at one walk
//! every 10 s it was 12-15% of the collector's CPU in the bar's bench, and
//! its cost grows with every directory within depth. The kernel reports
//! what a walk looks for through inotify, on cgroupfs as on the fixture
//! trees: a cgroup made, removed or renamed (`mkdir`, `rmdir` and `rename`
//! in the parent's directory) and a limit written (`IN_MODIFY` on the file,
//! reported on its cgroup's directory). Each directory is watched before it
//! is listed, so a cgroup made between the listing and the watch is still
//! reported. Files the kernel itself updates (`memory.events`,
//! `cgroup.events`) also report `IN_MODIFY`; they are not limits, and are
//! passed over.

use std::path::Path;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// One inotify instance watching the directories of one walk.
pub(super) struct CgroupWatch {
    inotify: Inotify,
    /// The limit files whose writes call for a walk (they are read only then).
    limit_files: Vec<&'static str>,
    /// Directories watched.
    pub(super) watched: usize,
}

impl CgroupWatch {
    /// A watch with nothing watched yet; the error says why none can be had.
    pub(super) fn new(limit_files: Vec<&'static str>) -> Result<CgroupWatch, String> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| format!("inotify_init1 failed: {e}"))?;
        Ok(CgroupWatch {
            inotify,
            limit_files,
            watched: 0,
        })
    }

    /// Watches `dir` for cgroups made, removed or renamed in it and for
    /// writes to its files. A directory gone meanwhile is no error (the walk
    /// will not list it either); running out of watches
    /// (`fs.inotify.max_user_watches`) is.
    pub(super) fn add(&mut self, dir: &Path) -> Result<(), String> {
        let flags = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_ONLYDIR;
        match self.inotify.add_watch(dir, flags) {
            Ok(_) => {
                self.watched += 1;
                Ok(())
            }
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::EACCES) => Ok(()),
            Err(e) => Err(format!("inotify_add_watch {} failed: {e}", dir.display())),
        }
    }

    /// Whether anything a walk would see happened since the last call: a
    /// cgroup made, removed or renamed, a limit file written, or events lost
    /// to a full queue. Reads every event waiting; an error reading them
    /// counts as a change, so the walk runs rather than missing one.
    pub(super) fn changed(&mut self) -> bool {
        let mut changed = false;
        loop {
            match self.inotify.read_events() {
                Ok(events) => {
                    changed |= events.iter().any(|event| {
                        let mask = event.mask;
                        if mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                            return true;
                        }
                        if mask.contains(AddWatchFlags::IN_ISDIR) {
                            return mask.intersects(
                                AddWatchFlags::IN_CREATE
                                    | AddWatchFlags::IN_DELETE
                                    | AddWatchFlags::IN_MOVED_FROM
                                    | AddWatchFlags::IN_MOVED_TO,
                            );
                        }
                        mask.contains(AddWatchFlags::IN_MODIFY)
                            && event.name.as_ref().is_some_and(|name| {
                                self.limit_files.iter().any(|limit| name == *limit)
                            })
                    });
                }
                Err(Errno::EAGAIN) => return changed,
                Err(Errno::EINTR) => continue,
                Err(_) => return true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_directories_made_removed_and_renamed_and_limits_written_only() {
        let dir = tempfile::tempdir().unwrap();
        let cgroup = dir.path().join("a.slice");
        std::fs::create_dir(&cgroup).unwrap();
        std::fs::write(cgroup.join("memory.max"), "max\n").unwrap();
        std::fs::write(cgroup.join("memory.events"), "oom 0\n").unwrap();
        let mut watch = CgroupWatch::new(vec!["memory.max"]).unwrap();
        watch.add(dir.path()).unwrap();
        watch.add(&cgroup).unwrap();
        watch.add(&dir.path().join("gone")).unwrap(); // not there: no error
        assert_eq!(watch.watched, 2);
        assert!(!watch.changed(), "nothing happened yet");

        // What the kernel updates on its own is not a reason to walk.
        std::fs::write(cgroup.join("memory.events"), "oom 1\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "a file, not a cgroup\n").unwrap();
        assert!(!watch.changed());

        std::fs::write(cgroup.join("memory.max"), "1048576\n").unwrap();
        assert!(watch.changed(), "a limit written");
        assert!(!watch.changed(), "each event reported once");

        let child = cgroup.join("b.scope");
        std::fs::create_dir(&child).unwrap();
        assert!(watch.changed(), "a cgroup made");
        std::fs::rename(&child, cgroup.join("c.scope")).unwrap();
        assert!(watch.changed(), "a cgroup renamed");
        std::fs::remove_dir(cgroup.join("c.scope")).unwrap();
        assert!(watch.changed(), "a cgroup removed");
        assert!(!watch.changed());
    }

    /// What the collector rests on, on this machine's own cgroup filesystem:
    /// kernfs reports a `mkdir`, a write to a limit file and an `rmdir`.
    /// Making a cgroup needs root (as CI runs); elsewhere the refusal must be
    /// a permission error, as in the perf collector's test of the real kernel.
    #[test]
    fn the_kernels_cgroup_filesystem_reports_cgroups_made_and_removed_and_limits_written() {
        let root = Path::new("/sys/fs/cgroup");
        let parent = if root.join("cgroup.controllers").exists() {
            root.to_path_buf()
        } else {
            ["cpu,cpuacct", "cpu", "memory", "pids"]
                .iter()
                .map(|h| root.join(h))
                .find(|h| h.join("cgroup.procs").exists())
                .expect("a cgroup v1 hierarchy with a cpu, memory or pids controller")
        };
        let limits = ["cpu.max", "memory.max", "pids.max", "cpu.cfs_quota_us"];
        let mut watch = CgroupWatch::new(limits.to_vec()).unwrap();
        watch.add(&parent).unwrap();
        assert_eq!(watch.watched, 1);
        let cgroup = parent.join(format!("vtax-watch-test-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&cgroup) {
            let errno = e.raw_os_error();
            assert!(
                matches!(errno, Some(libc::EACCES | libc::EPERM | libc::EROFS)),
                "{e}"
            );
            return;
        }
        let changed_after_mkdir = watch.changed();
        watch.add(&cgroup).unwrap();
        // Writing a limit's own value back changes nothing but is a write.
        let limit = limits.iter().map(|l| cgroup.join(l)).find(|l| l.exists());
        let rewritten = limit.as_ref().map(|l| {
            let value = std::fs::read_to_string(l).unwrap();
            std::fs::write(l, value.trim()).map_err(|e| e.to_string())
        });
        let changed_after_write = watch.changed();
        let removed = std::fs::remove_dir(&cgroup);
        let changed_after_rmdir = watch.changed();
        removed.unwrap();
        assert!(changed_after_mkdir, "mkdir in {}", parent.display());
        let limit = limit.expect("a cgroup has a limit file");
        rewritten.unwrap().unwrap();
        assert!(changed_after_write, "write to {}", limit.display());
        assert!(changed_after_rmdir, "rmdir in {}", parent.display());
    }
}
