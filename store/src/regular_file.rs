//! Opening the files a data directory holds without waiting on what is not
//! a file, and without following a link. Something else under a file's name
//! (a FIFO, whose open waits for a writer or a reader for ever; a directory;
//! a device) made the agent, a command or a test of the store hang at start,
//! deaf to SIGTERM; a symbolic link under a name the store writes (its
//! `LOCK`, a WAL or queue segment, the upload manifest) had a command run as
//! root truncate and write whatever file the link named. Every open of a
//! path in the data directory goes through here.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The most a file made here may grant: never writable by others, whatever
/// the umask of the shell a command runs from.
const CREATE_MODE: u32 = 0o644;

fn not_regular(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not a regular file: {what}"),
    )
}

/// Opens `path` as `options` say, and fails unless it is a regular file: a
/// symbolic link is refused, not followed (O_NOFOLLOW), and nothing else is
/// opened at all, so a FIFO cannot block and a device's open has no effect.
/// O_NONBLOCK, which a regular file ignores, covers what is put in its place
/// between the look and the open.
pub fn open(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    match path.symlink_metadata() {
        Ok(meta) if meta.file_type().is_symlink() => return Err(not_regular("a symbolic link")),
        Ok(meta) if !meta.is_file() => return Err(not_regular(kind(&meta))),
        _ => {}
    }
    let file = options
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .mode(CREATE_MODE)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => not_regular("a symbolic link"),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(kind(&meta)));
    }
    Ok(file)
}

/// A new, empty regular file at `path` for writing (a temporary file, a new
/// segment), whatever was there: a file, link, FIFO, socket or device under
/// the name is removed first (the link itself, not what it names), and the
/// file is made with O_EXCL, which follows no link. A directory there is an
/// error.
pub fn create_fresh(path: &Path) -> io::Result<File> {
    match path.symlink_metadata() {
        Ok(meta) if meta.is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a directory is in the way",
            ))
        }
        Ok(_) => std::fs::remove_file(path)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(CREATE_MODE)
        .open(path)
}

/// Makes `dir` below `base` (which exists), with what is missing between
/// them, a step at a time, and fails at a symbolic link on the way: through
/// one (a `quarantine/` linked elsewhere), what is moved or copied into `dir`
/// would land outside the store, over whatever bears its name there.
pub fn create_dirs_below(base: &Path, dir: &Path) -> io::Result<()> {
    let mut at = base.to_path_buf();
    for part in dir.strip_prefix(base).unwrap_or(dir).components() {
        at.push(part);
        match at.symlink_metadata() {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: a symbolic link, not followed", at.display()),
                ));
            }
            Ok(_) => {}
            Err(_) => std::fs::create_dir(&at)?,
        }
    }
    Ok(())
}

fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a file"
    }
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

    /// A link under a name the store writes is refused, and what it names
    /// is neither truncated nor written; `create_fresh` replaces the link
    /// itself.
    #[test]
    fn a_link_is_refused_and_what_it_names_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "precious").unwrap();
        let link = dir.path().join("LOCK");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        for options in [
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true),
            OpenOptions::new().append(true),
            OpenOptions::new().read(true),
        ] {
            let error = open(&link, options).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
            assert!(error.to_string().contains("symbolic link"), "{error}");
        }
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious");

        use std::io::Write;
        let mut file = create_fresh(&link).unwrap();
        file.write_all(b"new").unwrap();
        assert!(!link.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "new");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious");
        assert!(create_fresh(dir.path()).is_err(), "a directory stays");
    }

    #[test]
    fn a_new_file_is_never_writable_by_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: umask only swaps the process's mask; restored below.
        let old = unsafe { libc::umask(0) };
        let made = open(
            &dir.path().join("a"),
            OpenOptions::new().write(true).create(true),
        )
        .map(|f| f.metadata().unwrap().permissions().mode() & 0o777);
        let fresh = create_fresh(&dir.path().join("b"))
            .map(|f| f.metadata().unwrap().permissions().mode() & 0o777);
        unsafe { libc::umask(old) };
        assert_eq!(made.unwrap(), 0o644);
        assert_eq!(fresh.unwrap(), 0o644);
    }
}
