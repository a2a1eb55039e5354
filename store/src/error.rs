//! Errors of the store.

use std::path::PathBuf;

/// What can go wrong in the store. Every variant names what it was working on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O error on a named path.
    #[error("{op} {path}: {source}")]
    Io {
        /// What the store was doing.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A batch does not match its table's declaration, or a table is unknown.
    #[error("schema: {0}")]
    Schema(String),
    /// A file in the store is not what the store wrote.
    #[error("corrupt {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Parquet or Arrow failed while encoding or decoding.
    #[error("parquet {path}: {source}")]
    Parquet {
        /// The file.
        path: PathBuf,
        /// The library's error.
        source: parquet::errors::ParquetError,
    },
    /// Arrow compute failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// The WAL cannot take more rows until a write succeeds (disk full).
    #[error("the WAL holds {pending_bytes} unwritten bytes after a failed write; rejecting rows until the disk takes them: {last_error}")]
    Backlogged {
        /// Bytes waiting to be written.
        pending_bytes: usize,
        /// The write error that started the backlog.
        last_error: String,
    },
    /// A node name that cannot name the store's files (`check_node_name`).
    #[error("node name {name:?}: {reason}")]
    NodeName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Another process holds the store open for writing.
    #[error("the store at {path} is open for writing by another process ({holder})")]
    Locked {
        /// The data directory.
        path: PathBuf,
        /// Who holds it, as written in the lock file.
        holder: String,
    },
    /// A merge was told to stop (the agent is stopping) before it finished;
    /// nothing was published and its inputs stay.
    #[error("the merge was stopped before it finished; its inputs stay")]
    Stopped,
    /// A merge panicked on the compaction thread (a bug); its inputs stay.
    #[error("a merge panicked, its inputs stay: {0}")]
    Panicked(String),
    /// A reader beside a writer found a listed file removed (merged away,
    /// quarantined, retired) before it could open it, at every attempt.
    #[error("the store at {path} changed under the read {attempts} times in a row (last: {last}); try again")]
    Changing {
        /// The data directory.
        path: PathBuf,
        /// Attempts made.
        attempts: usize,
        /// The last attempt's error, naming the file.
        last: String,
    },
}

impl Error {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }

    /// The file an error shows to be damaged: one that is not what the store
    /// wrote, as opposed to one the OS failed to read.
    pub fn damaged_file(&self) -> Option<&std::path::Path> {
        match self {
            Error::Corrupt { path, .. } => Some(path),
            Error::Parquet { path, source } if os_error(source).is_none() => Some(path),
            _ => None,
        }
    }

    /// Whether the error is a file or directory that is not there (to a reader
    /// beside a writer: removed since it was listed).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// Whether the error is the disk being full (ENOSPC, or EDQUOT for a quota).
    pub fn is_disk_full(&self) -> bool {
        let full =
            |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT));
        match self {
            Error::Io { source, .. } => full(source),
            Error::Parquet { source, .. } => {
                // The writer wraps the OS error; walk the chain to find it.
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
                while let Some(e) = cause {
                    if e.downcast_ref::<std::io::Error>().is_some_and(full) {
                        return true;
                    }
                    cause = e.source();
                }
                // Some paths keep only the message.
                source.to_string().contains("No space left on device")
            }
            Error::Backlogged { .. } => true,
            _ => false,
        }
    }

    /// What kind of fault this is, without the file it met it on: the same
    /// for every write that a full disk fails, whichever file it was. Log
    /// lines that repeat are rate-limited by it ([`crate::log_limit`]).
    pub fn kind(&self) -> String {
        if self.is_disk_full() {
            return "disk full".into();
        }
        match self {
            Error::Io { op, source, .. } => format!("{op}: {:?}", source.kind()),
            Error::Parquet { source, .. } => match os_error(source) {
                Some(io) => format!("parquet: {:?}", io.kind()),
                None => "parquet".into(),
            },
            Error::Schema(_) => "schema".into(),
            Error::Corrupt { .. } => "corrupt".into(),
            Error::Arrow(_) => "arrow".into(),
            Error::Backlogged { .. } => "backlogged".into(),
            Error::NodeName { .. } => "node name".into(),
            Error::Locked { .. } => "locked".into(),
            Error::Stopped => "stopped".into(),
            Error::Panicked(_) => "panicked".into(),
            Error::Changing { .. } => "changing".into(),
        }
    }
}

/// Result with the store's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The message a panic carried, for an error that reports it.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// The OS's error a Parquet error carries, if it carries one.
pub(crate) fn os_error(e: &parquet::errors::ParquetError) -> Option<&std::io::Error> {
    match e {
        parquet::errors::ParquetError::External(source) => source
            .downcast_ref::<std::io::Error>()
            .filter(|io| io.raw_os_error().is_some()),
        _ => None,
    }
}
