//! Files kept open between ticks and re-read from offset 0.
//!
//! Opening a /proc, /sys or cgroup file costs a path walk, a permission check
//! and a file allocation in the kernel; on a VM those syscalls are most of a
//! collector's cost. procfs, sysfs and cgroupfs files are seq_files whose text
//! the kernel regenerates on every read from offset 0, so a descriptor opened
//! once and read with `pread(fd, buf, 0)` gives fresh values for one syscall.
//! A removed cgroup or device answers ENODEV (the caller treats it as gone);
//! on a regular filesystem (fixture trees) a deleted file keeps its old text,
//! so `is_deleted` lets callers notice it as the kernel would report it.

use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Larger than any /proc, /sys or cgroup file a collector reads (a big
/// memory.stat is a few KiB): a file that grows past it is not what we think
/// it is (a link to a device, a runaway fixture), and reading on would only
/// grow the buffer.
pub const MAX_FILE_BYTES: usize = 4 << 20;

fn too_large(path: &Path) -> std::io::Error {
    std::io::Error::new(
        ErrorKind::InvalidData,
        format!("{}: larger than {MAX_FILE_BYTES} bytes", path.display()),
    )
}

/// A file read again and again through one descriptor.
#[derive(Debug)]
pub struct KeptFile {
    path: PathBuf,
    file: Option<File>,
    /// Read until a read returns nothing (see [`KeptFile::listing`]).
    listing: bool,
}

impl KeptFile {
    /// A file to be opened on its first read, whose text the kernel makes
    /// whole at each read (a sysfs attribute, a cgroup file, `/proc/stat`):
    /// a read shorter than the buffer is its end.
    pub fn new(path: PathBuf) -> Self {
        KeptFile {
            path,
            file: None,
            listing: false,
        }
    }

    /// A file the kernel lists a record at a time (`mountinfo`,
    /// `diskstats`): one read returns at most a page of records, so a short
    /// read is not its end, and it is read until a read returns nothing.
    /// Read as a whole file, mounts past the first 4 KiB of mountinfo (some
    /// 30 on a node) were missing.
    pub fn listing(path: PathBuf) -> Self {
        KeptFile {
            path,
            file: None,
            listing: true,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the whole file into `buf` (grown as needed, never shrunk) and
    /// returns its length. One `pread` when the text fits, which it does after
    /// the first tick. Errors are the kernel's (NotFound, ENODEV, EINVAL...);
    /// after one, the descriptor is dropped and the next read opens afresh.
    pub fn read(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        if buf.len() < 4096 {
            buf.resize(4096, 0);
        }
        let file = match &self.file {
            Some(f) => f,
            None => match File::open(&self.path) {
                Ok(f) => self.file.insert(f),
                // Out of descriptors: read once the classic way instead.
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                    return read_unkept(&self.path, buf);
                }
                Err(e) => return Err(e),
            },
        };
        let mut len = 0;
        loop {
            match file.read_at(&mut buf[len..], len as u64) {
                Ok(0) => return Ok(len),
                Ok(n) => {
                    len += n;
                    // A file made whole at each read returns all of it that
                    // fits; a short read is its end. A listing goes on to
                    // the read that returns nothing.
                    if len < buf.len() && !self.listing {
                        return Ok(len);
                    }
                    if len == buf.len() {
                        if len >= MAX_FILE_BYTES {
                            return Err(too_large(&self.path));
                        }
                        let grown = buf.len() * 2;
                        buf.resize(grown, 0);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.file = None;
                    return Err(e);
                }
            }
        }
    }

    /// Whether the file was deleted while held open (a regular filesystem's
    /// way of saying what sysfs says with ENODEV).
    pub fn is_deleted(&self) -> bool {
        self.file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .is_some_and(|m| m.nlink() == 0)
    }

    /// Closes the descriptor; the next read opens the path again.
    pub fn close(&mut self) {
        self.file = None;
    }
}

fn read_unkept(path: &Path, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let file = File::open(path)?;
    let mut len = 0;
    loop {
        if len == buf.len() {
            if len >= MAX_FILE_BYTES {
                return Err(too_large(path));
            }
            let grown = buf.len() * 2;
            buf.resize(grown, 0);
        }
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) => return Ok(len),
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Whether a read error means the file's cgroup or device is not there:
/// ENOENT, or ENODEV from one removed while its file was held open.
pub fn is_gone(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENODEV)
}

/// Raises this process's soft limit on open files to its hard limit, as the
/// Go runtime does for node_exporter: kept-open files need one descriptor
/// each, and 1024 (the usual soft limit) is a few hundred cgroups.
pub fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
    }
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    /// procfs regenerates a seq_file's text on each read from offset 0.
    #[test]
    fn rereading_a_proc_file_gives_fresh_text() {
        let mut uptime = KeptFile::new("/proc/uptime".into());
        let mut buf = Vec::new();
        let n = uptime.read(&mut buf).unwrap();
        let first = String::from_utf8_lossy(&buf[..n]).to_string();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let n = uptime.read(&mut buf).unwrap();
        let second = String::from_utf8_lossy(&buf[..n]).to_string();
        assert_ne!(first, second, "uptime moves in 50 ms");
        assert!(second.ends_with('\n'));
    }

    #[test]
    fn long_files_rewritten_files_and_deleted_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let long: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, &long).unwrap();
        let mut file = KeptFile::new(path.clone());
        let mut buf = Vec::new();
        let n = file.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], long.as_bytes(), "grows past the first buffer");
        std::fs::write(&path, "short\n").unwrap();
        let n = file.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"short\n", "same inode, new text");
        assert!(!file.is_deleted());
        std::fs::remove_file(&path).unwrap();
        assert!(file.is_deleted());
        file.close();
        assert_eq!(file.read(&mut buf).unwrap_err().kind(), ErrorKind::NotFound);
    }

    /// A listing the kernel makes a record at a time returns at most a page
    /// a read: read whole, it is cut at the first page; as a listing, every
    /// record is there. /proc/self/smaps lists each mapping of this process
    /// in some 20 lines, well past a page.
    #[test]
    fn a_listing_is_read_past_its_first_page() {
        let mut buf = Vec::new();
        let whole = std::fs::read_to_string("/proc/self/smaps").unwrap();
        assert!(whole.len() > 3 * 4096, "{} bytes", whole.len());
        let n = KeptFile::new("/proc/self/smaps".into())
            .read(&mut buf)
            .unwrap();
        assert!(n <= 4096 + 4096, "read whole, the first page: {n}");
        let mut listing = KeptFile::listing("/proc/self/smaps".into());
        for _ in 0..2 {
            let n = listing.read(&mut buf).unwrap();
            let text = String::from_utf8_lossy(&buf[..n]);
            // Mappings come and go as other tests' threads start and end:
            // of the same order, and far past the first page.
            let count = |t: &str| t.lines().filter(|l| l.starts_with("Rss:")).count();
            let (got, want) = (count(&text), count(&whole));
            assert!(
                2 * got >= want && n > 3 * 4096,
                "{got} mappings of {want}, {n} bytes"
            );
            assert!(text.ends_with('\n'));
        }
        // A regular file too.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let long: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, &long).unwrap();
        let n = KeptFile::listing(path).read(&mut buf).unwrap();
        assert_eq!(&buf[..n], long.as_bytes());
    }

    #[test]
    fn an_endless_file_is_an_error_not_a_runaway_buffer() {
        let mut zero = KeptFile::new("/dev/zero".into());
        let mut buf = Vec::new();
        let err = zero.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData);
        assert!(err.to_string().contains("/dev/zero"), "{err}");
        assert!(buf.len() <= 2 * MAX_FILE_BYTES);
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let raised = raise_open_file_limit();
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only the struct we pass.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        // The old assertion held whether or not anything was raised.
        assert_eq!(limit.rlim_cur, limit.rlim_max, "soft limit at the hard one");
        assert_eq!(raised, limit.rlim_cur, "returns the limit now in force");
        assert!(raised >= 1024);
    }
}
