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
/// between the look and the open. A file it creates keeps the creator's
/// owner: [`open_or_create`] makes a missing one the directory's.
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

/// Opens `path` as [`open`] does (`options` should ask to create it), making
/// it first with [`create_new`] when there is nothing under its name, so that
/// a file root makes takes the directory's owner.
pub fn open_or_create(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    if matches!(path.symlink_metadata(), Err(e) if e.kind() == io::ErrorKind::NotFound) {
        match create_new(path) {
            Ok(file) => return Ok(file),
            // Made by another process since the look: opened as it is.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    open(path, options)
}

/// A new, empty regular file at `path`, open for reading and writing, made
/// with O_EXCL (which follows no link and fails on whatever is there), in
/// the directory `path` names, opened once: the file is made there and
/// takes that directory's owner and group when root makes it (see
/// [`give_owner_of`]).
pub fn create_new(path: &Path) -> io::Result<File> {
    let (dir, name) = open_parent(path)?;
    create_new_at(&dir, &name)
}

/// A new, empty regular file `name` in the open directory `dir`, as
/// [`create_new`] makes one.
pub fn create_new_at(dir: &File, name: &std::ffi::CStr) -> io::Result<File> {
    // SAFETY: openat on a descriptor we own and a NUL-terminated name; the
    // descriptor it returns is owned by the File made from it.
    let fd = unsafe {
        libc::openat(
            std::os::fd::AsRawFd::as_raw_fd(dir),
            name.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            CREATE_MODE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor nothing else owns.
    let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    give_owner_of(dir, &file);
    Ok(file)
}

/// `name` as the C string the `*at` calls take.
pub fn c_name(name: &std::ffi::OsStr) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(name.as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// The lstat of `name` in the open directory `dir` (a link is not followed).
pub fn stat_at(dir: &File, name: &std::ffi::CStr) -> io::Result<libc::stat> {
    // SAFETY: a zeroed stat is a valid value for fstatat to fill.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstatat on a descriptor we own, a NUL-terminated name and a
    // stat it writes to.
    let rc = unsafe {
        libc::fstatat(
            std::os::fd::AsRawFd::as_raw_fd(dir),
            name.as_ptr(),
            &mut stat,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat)
}

/// Removes the file (or link) `name` from the open directory `dir`.
pub fn remove_at(dir: &File, name: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: unlinkat on a descriptor we own and a NUL-terminated name.
    if unsafe { libc::unlinkat(std::os::fd::AsRawFd::as_raw_fd(dir), name.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Renames `from` in the open directory `from_dir` to `to` in `to_dir`:
/// through descriptors, so a directory swapped for a link on either path
/// meanwhile moves nothing into or out of what the link names.
pub fn rename_at(
    from_dir: &File,
    from: &std::ffi::CStr,
    to_dir: &File,
    to: &std::ffi::CStr,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: renameat on descriptors we own and NUL-terminated names.
    let rc = unsafe {
        libc::renameat(
            from_dir.as_raw_fd(),
            from.as_ptr(),
            to_dir.as_raw_fd(),
            to.as_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new, empty regular file at `path` for writing (a temporary file, a new
/// segment), whatever was there: a file, link, FIFO, socket or device under
/// the name is removed first (the link itself, not what it names), and the
/// file is made as [`create_new`] makes it. A directory there is an error.
pub fn create_fresh(path: &Path) -> io::Result<File> {
    let (dir, name) = open_parent(path)?;
    create_fresh_at(&dir, &name)
}

/// A new, empty regular file `name` in the open directory `dir`, whatever
/// was there, as [`create_fresh`] makes one.
pub fn create_fresh_at(dir: &File, name: &std::ffi::CStr) -> io::Result<File> {
    match stat_at(dir, name) {
        Ok(stat) if stat.st_mode & libc::S_IFMT == libc::S_IFDIR => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a directory is in the way",
            ))
        }
        Ok(_) => remove_at(dir, name)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    create_new_at(dir, name)
}

/// The directory `path` is named in, open (links above the name followed,
/// as any path's are), and the name.
fn open_parent(path: &Path) -> io::Result<(File, std::ffi::CString)> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: no file name", path.display()),
        )
    })?;
    let parent = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => Path::new("/"),
    };
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(parent)?;
    Ok((dir, c_name(name)?))
}

/// Gives what root just made in `dir` (through a descriptor of its own, so
/// nothing put under the name since is touched) the owner and group of
/// `dir`, read from the same descriptor the thing was made through. The
/// agent runs as its own user and owns the data directory, while an
/// operator runs `upload`, `compact`, `import` or `verify --quarantine` as
/// root: a state file, segment or partition directory made then was root's,
/// and the agent failed on it with "Permission denied" at every pass until
/// someone changed its owner by hand. Not root, a process can give nothing
/// away, and what it makes is its own as the directory's is. Best effort: a
/// filesystem that keeps no owners (FAT, some FUSE mounts) still takes the
/// write.
fn give_owner_of(dir: &File, made: &File) {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid reads the process's effective uid; it cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let Ok(owner) = dir.metadata() else {
        return;
    };
    let _ = std::os::unix::fs::fchown(made, Some(owner.uid()), Some(owner.gid()));
}

/// Makes `dir` and whatever is missing above it, as `create_dir_all` does,
/// each new directory made as [`make_dir`] makes it.
pub fn create_dirs(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.as_os_str().is_empty() && !at.is_dir() {
        missing.push(at);
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    for made in missing.into_iter().rev() {
        make_dir(made)?;
    }
    Ok(())
}

/// The most a directory made here may grant, as [`CREATE_MODE`] for a file.
const CREATE_DIR_MODE: libc::mode_t = 0o755;

/// One new directory at `path`, as [`make_dir_at`] makes it; one there
/// already is no error (another process may have made it).
fn make_dir(path: &Path) -> io::Result<()> {
    let (dir, name) = open_parent(path)?;
    match make_dir_at(&dir, &name) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        other => other,
    }
}

/// One new directory `name` in the open directory `dir`, made (mkdirat)
/// and opened again (openat, O_NOFOLLOW) through `dir`'s descriptor, and
/// given `dir`'s owner (see [`give_owner_of`]) only if what the name holds
/// then is still an empty directory of root's: opened by its path, the
/// directory could be swapped for a link between the two, and the link's
/// target given away.
fn make_dir_at(dir: &File, name: &std::ffi::CStr) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    // SAFETY: mkdirat on a descriptor we own and a NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), CREATE_DIR_MODE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let Ok(made) = open_dir_at(dir, name) else {
        // Gone or swapped since: made, and given to no one.
        return Ok(());
    };
    let fresh = made
        .metadata()
        .is_ok_and(|m| m.is_dir() && m.uid() == 0 && m.nlink() == 2);
    if fresh {
        give_owner_of(dir, &made);
    }
    Ok(())
}

/// The directory `name` in the open directory `dir`, opened through its
/// descriptor without following a link (O_NOFOLLOW, O_DIRECTORY).
fn open_dir_at(dir: &File, name: &std::ffi::CStr) -> io::Result<File> {
    // SAFETY: openat on a descriptor we own and a NUL-terminated name; the
    // descriptor it returns is owned by the File made from it.
    let fd = unsafe {
        libc::openat(
            std::os::fd::AsRawFd::as_raw_fd(dir),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor nothing else owns.
    Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Makes `dir` below `base` (which exists), with what is missing between
/// them, a step at a time, and fails at a symbolic link on the way: through
/// one (a `quarantine/` linked elsewhere), what is moved or copied into `dir`
/// would land outside the store, over whatever bears its name there.
pub fn create_dirs_below(base: &Path, dir: &Path) -> io::Result<()> {
    open_dirs_below(base, dir, true).map(drop)
}

/// The directory `dir` below `base`, opened a step at a time from `base`,
/// each step through the descriptor of the one before it with O_NOFOLLOW
/// (and, with `create`, made where missing, as [`make_dir_at`] makes it).
/// A symbolic link on the way is an error. What is then made, removed or
/// renamed through the descriptor returned happens in `dir`, whatever is
/// swapped onto its path meanwhile: checked a step at a time by path, a
/// directory swapped for a link after its check let root move a file of the
/// store over one of root's outside it.
pub fn open_dirs_below(base: &Path, dir: &Path, create: bool) -> io::Result<File> {
    let below = dir.strip_prefix(base).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not below {}", dir.display(), base.display()),
        )
    })?;
    let mut at = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(base)?;
    let mut walked = base.to_path_buf();
    for part in below.components() {
        walked.push(part);
        let name = c_name(part.as_os_str())?;
        if create {
            match make_dir_at(&at, &name) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        // A link opened with O_DIRECTORY and O_NOFOLLOW fails as no
        // directory (ENOTDIR), or as a link (ELOOP): which it is, its lstat
        // says.
        at = open_dir_at(&at, &name).map_err(|e| {
            let is_link = matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
                && stat_at(&at, &name).is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFLNK);
            match e.raw_os_error() {
                _ if is_link => io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: a symbolic link, not followed", walked.display()),
                ),
                Some(libc::ENOTDIR) => io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not a directory", walked.display()),
                ),
                _ => e,
            }
        })?;
    }
    Ok(at)
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

    /// Run as root in a directory another user owns, what is made takes
    /// that owner; a file that was there keeps its own. Run as anyone else,
    /// all is the runner's.
    #[test]
    fn what_is_made_takes_the_owner_of_its_directory() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("store");
        std::fs::create_dir(&base).unwrap();
        std::fs::write(base.join("there"), "x").unwrap();
        // SAFETY: geteuid reads the effective uid; it cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let owner = if root {
            std::os::unix::fs::chown(&base, Some(12345), Some(12346)).unwrap();
            (12345, 12346)
        } else {
            let meta = base.metadata().unwrap();
            (meta.uid(), meta.gid())
        };
        let there = base.join("there").metadata().unwrap();
        let there = (there.uid(), there.gid());

        open_or_create(
            &base.join("LOCK"),
            OpenOptions::new().write(true).create(true),
        )
        .unwrap();
        open_or_create(&base.join("there"), OpenOptions::new().append(true)).unwrap();
        open(
            &base.join("opened"),
            OpenOptions::new().write(true).create(true),
        )
        .unwrap();
        create_fresh(&base.join("segment.tmp")).unwrap();
        create_dirs(&base.join("tables/cpu/date=2026-12-07")).unwrap();
        create_fresh(&base.join("tables/cpu/date=2026-12-07/a.parquet")).unwrap();
        create_dirs_below(&base, &base.join("quarantine/tables/cpu")).unwrap();

        let owner_of = |path: &str| {
            let meta = base.join(path).symlink_metadata().unwrap();
            (meta.uid(), meta.gid())
        };
        for made in [
            "LOCK",
            "segment.tmp",
            "tables",
            "tables/cpu",
            "tables/cpu/date=2026-12-07",
            "tables/cpu/date=2026-12-07/a.parquet",
            "quarantine",
            "quarantine/tables/cpu",
        ] {
            assert_eq!(owner_of(made), owner, "{made}");
        }
        assert_eq!(
            owner_of("there"),
            there,
            "a file that was there keeps its owner"
        );
        let runner = {
            let meta = dir.path().metadata().unwrap();
            (meta.uid(), meta.gid())
        };
        assert_eq!(owner_of("opened"), runner, "open gives nothing away");
        // Made twice, or already there: no error.
        create_dirs(&base.join("tables/cpu")).unwrap();
        create_dirs(&base).unwrap();
    }

    /// The owner of a data directory swaps what root makes there, between
    /// its making and its chown, for a link to a directory of root's, or for
    /// a hard link to a file of root's, over and over: nothing of root's
    /// outside is given away. (Root made the directory, then opened it by
    /// its path, which followed the link; it opened the file with O_CREAT
    /// and no O_EXCL, and took a hard link put there for its own new file.)
    #[test]
    fn a_swap_between_making_and_giving_away_gives_nothing_away() {
        use std::os::unix::fs::MetadataExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("store");
        std::fs::create_dir(&base).unwrap();
        // SAFETY: geteuid reads the effective uid; it cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&base, Some(12345), Some(12346)).unwrap();
        }
        let root_dir = dir.path().join("roots-dir");
        std::fs::create_dir(&root_dir).unwrap();
        let root_file = dir.path().join("roots-file");
        std::fs::write(&root_file, "").unwrap();
        let owner = |p: &Path| {
            let m = p.symlink_metadata().unwrap();
            (m.uid(), m.gid())
        };
        let (dir_owner, file_owner) = (owner(&root_dir), owner(&root_file));
        let made_dir = base.join("upload");
        let made_file = base.join("LOCK");
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if std::fs::remove_dir(&made_dir).is_ok() {
                        let _ = std::os::unix::fs::symlink(&root_dir, &made_dir);
                    }
                    if std::fs::remove_file(&made_file).is_ok() {
                        let _ = std::fs::hard_link(&root_file, &made_file);
                    }
                }
            });
            for _ in 0..3000 {
                let _ = std::fs::remove_file(&made_dir);
                let _ = make_dir(&made_dir);
                let _ = std::fs::remove_file(&made_file);
                let _ = open_or_create(&made_file, OpenOptions::new().write(true).create(true));
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_eq!(owner(&root_dir), dir_owner);
        assert_eq!(owner(&root_file), file_owner);
    }

    /// What is renamed through the descriptors `open_dirs_below` gives lands
    /// in the directories opened, though both are swapped for links to a
    /// directory elsewhere afterwards; and a link on the way is refused.
    #[test]
    fn a_rename_between_opened_directories_follows_no_swap() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("store");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(base.join("tables/t/date=x")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("f.parquet"), "precious").unwrap();
        std::fs::write(base.join("tables/t/date=x/f.parquet"), "damaged").unwrap();
        let from = open_dirs_below(&base, &base.join("tables/t/date=x"), false).unwrap();
        let to = open_dirs_below(&base, &base.join("quarantine/t/date=x"), true).unwrap();
        for swapped in ["tables/t/date=x", "quarantine/t/date=x"] {
            let swapped = base.join(swapped);
            std::fs::rename(&swapped, swapped.with_extension("opened")).unwrap();
            std::os::unix::fs::symlink(&outside, &swapped).unwrap();
        }
        let name = c_name(std::ffi::OsStr::new("f.parquet")).unwrap();
        rename_at(&from, &name, &to, &name).unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.join("f.parquet")).unwrap(),
            "precious"
        );
        assert_eq!(
            std::fs::read_to_string(base.join("quarantine/t/date=x.opened/f.parquet")).unwrap(),
            "damaged"
        );
        let error = open_dirs_below(&base, &base.join("quarantine/t/date=x/deeper"), true)
            .unwrap_err()
            .to_string();
        assert!(
            error.ends_with("date=x: a symbolic link, not followed"),
            "{error}"
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            1,
            "nothing made there"
        );
        let error = open_dirs_below(&base, &outside, false)
            .unwrap_err()
            .to_string();
        assert!(error.contains("is not below"), "{error}");
    }

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
