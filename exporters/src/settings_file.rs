//! Reading a file an operator names for settings (the agent's config, the
//! web config, a secret): a regular file of bounded size, read whole. A FIFO
//! would block the reading thread until someone writes to it (the store's
//! thread, on a reload: no fsync, no watchdog, no stop), and `/dev/zero` or
//! a runaway file would be read until memory runs out.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The largest settings file read: far past any real config (the example
/// config with every key documented is under 40 KiB).
pub const MAX_SETTINGS_FILE_BYTES: u64 = 4 << 20;

/// The text of the regular file at `path`, at most
/// [`MAX_SETTINGS_FILE_BYTES`] long; an error says what the path is when it
/// is not a regular file, and the line of the first byte that is not UTF-8.
pub fn read(path: &Path) -> io::Result<String> {
    // Without O_NONBLOCK, opening a FIFO for reading waits for a writer.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what}, not a regular file"),
        ));
    }
    let mut bytes = Vec::new();
    // Bounded by the read, not the size stat gives: a file may grow.
    file.take(MAX_SETTINGS_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SETTINGS_FILE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_SETTINGS_FILE_BYTES} bytes: not a settings file"),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..valid]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("line {line}: not UTF-8 text"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_reads_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vtax.toml");
        std::fs::write(&path, "[web]\nlisten_address = \"127.0.0.1:9\"\n").unwrap();
        assert_eq!(
            read(&path).unwrap(),
            "[web]\nlisten_address = \"127.0.0.1:9\"\n"
        );
        std::fs::write(&path, "").unwrap();
        assert_eq!(read(&path).unwrap(), "");
    }

    /// A FIFO with no writer, a directory, a device: each refused at once,
    /// named; none is waited on or read without end.
    #[test]
    fn what_is_not_a_regular_file_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.toml");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path only.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        let e = read(&fifo).unwrap_err();
        assert!(e.to_string().contains("a FIFO, not a regular file"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        let e = read(dir.path()).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let e = read(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("a device"), "{e}");
    }

    #[test]
    fn a_file_past_the_bound_or_not_utf8_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        let file = std::fs::File::create(&big).unwrap();
        file.set_len(MAX_SETTINGS_FILE_BYTES + 1).unwrap();
        let e = read(&big).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, b"a = 1\nb = \"\xff\"\n").unwrap();
        let e = read(&bad).unwrap_err();
        assert_eq!(e.to_string(), "line 2: not UTF-8 text");
    }
}
