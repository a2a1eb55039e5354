//! Opening the files a data directory holds without waiting on what is not
//! a file. Something else under a file's name (a FIFO, whose open waits for
//! a writer or a reader for ever; a directory; a device) made the agent, a
//! command or a test of the store hang at start, deaf to SIGTERM: every
//! open of a path in the data directory goes through here.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens `path` as `options` say, without blocking (O_NONBLOCK, which a
/// regular file ignores), and fails unless it is a regular file.
pub fn open(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    let file = options.custom_flags(libc::O_NONBLOCK).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Opens `path` for reading; see [`open`].
pub fn open_read(path: &Path) -> io::Result<File> {
    open(path, OpenOptions::new().read(true))
}

/// The bytes of the regular file at `path`; see [`open`].
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_read(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The text of the regular file at `path`; see [`open`].
pub fn read_to_string(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    open_read(path)?.read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_or_a_directory_is_refused_at_once_and_a_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo touches no memory of ours.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        for path in [&fifo, &dir.path().to_path_buf()] {
            let error = read(path).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
            let error = open(path, OpenOptions::new().read(true).write(true)).unwrap_err();
            assert!(
                matches!(
                    error.kind(),
                    io::ErrorKind::InvalidData | io::ErrorKind::IsADirectory
                ),
                "{error}"
            );
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let file = dir.path().join("file");
        std::fs::write(&file, "12345").unwrap();
        assert_eq!(read_to_string(&file).unwrap(), "12345");
    }
}
