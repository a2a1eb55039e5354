//! Parquet files of the store: how they are encoded, published and described.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, DictionaryArray, RecordBatch, StringArray};
use arrow_buffer::Buffer;
use arrow_schema::{FieldRef, Schema};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::arrow_writer::{
    compute_leaves, ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory,
};
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter, ArrowWriter};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::{KeyValue, PageIndexPolicy, ParquetMetaData, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::error::{Error, Result};
use crate::schema::{FieldType, TableDef, SCHEMA_VERSION, TIME_COLUMN};
use crate::{date_string, parse_date, HOUR_US};

mod read;
mod write;

pub use read::*;
pub use write::*;

#[cfg(test)]
mod tests;

/// Metadata keys written into every file.
pub mod keys {
    /// Layout version ([`crate::schema::SCHEMA_VERSION`]).
    pub const SCHEMA_VERSION: &str = "vtax.schema_version";
    /// Table name.
    pub const TABLE: &str = "vtax.table";
    /// Node that wrote the file.
    pub const NODE: &str = "vtax.node";
    /// `hour:seq` pairs: per bucket, the highest WAL frame the file holds.
    pub const WATERMARKS: &str = "vtax.watermarks";
    /// Names of the files a compacted file replaces.
    pub const COMPACTED_FROM: &str = "vtax.compacted_from";
    /// Names among `vtax.compacted_from` of multi-hour merges (a day merged
    /// in rounds) whose own inputs are listed there too: their rows are all
    /// in the other names, so an uploader looks past them.
    pub const COMPACTED_INTERMEDIATES: &str = "vtax.compacted_intermediates";
    /// `column=unit` pairs.
    pub const UNITS: &str = "vtax.units";
    /// `<bytes>:<crc32 in hex>`: the CRC-32 of the file's first `bytes` bytes,
    /// its magic and every page, everything before the page index and footer.
    /// Parquet's own page checksums are optional and this writer's library
    /// never writes them; without one a flipped bit in a compressed page can
    /// decode to a wrong value without an error.
    pub const PAGES_CRC32: &str = "vtax.pages_crc32";
}

/// What the store knows about one published file, from its name and footer.
#[derive(Clone, Debug)]
pub struct FileInfo {
    /// Full path.
    pub path: PathBuf,
    /// Table.
    pub table: String,
    /// Day number of its partition.
    pub day: i64,
    /// Node that wrote it (`vtax.node`).
    pub node: String,
    /// Bytes on disk.
    pub bytes: u64,
    /// Rows.
    pub rows: u64,
    /// Per bucket hour: highest WAL frame held.
    pub watermarks: BTreeMap<i64, u64>,
    /// File names this file replaces (compaction): the files it merged and,
    /// for those that were multi-hour merges themselves, the files they merged.
    pub compacted_from: Vec<String>,
    /// The names in `compacted_from` whose rows are all in the other names
    /// (`vtax.compacted_intermediates`).
    pub compacted_intermediates: Vec<String>,
    /// Smallest and largest time in the file, from its statistics.
    pub time_range_us: Option<(i64, i64)>,
    /// Bytes from the start that `vtax.pages_crc32` covers, and their CRC-32;
    /// none in files written before it was recorded.
    pub pages_crc32: Option<(u64, u32)>,
}

impl FileInfo {
    /// The file's name within its partition.
    pub fn name(&self) -> &str {
        self.path.file_name().and_then(|n| n.to_str()).unwrap_or("")
    }

    /// Whether the file is a merged file under its pending name
    /// ([`pending_name`]): its merge was interrupted before it was published.
    pub fn is_pending(&self) -> bool {
        published_name(self.name()).is_some()
    }

    /// Whether the file will not change any more, as far as the files tell:
    /// every hour it holds ended at least `settle_us` before `now_us`, and, when
    /// it holds one hour, no other file of its partition (`partition`, which may
    /// include the file itself) holds only that hour, since such parts are still
    /// to be merged into one. Rows a writer still buffers are invisible here, so
    /// `settle_us` should exceed the writer's publish grace. Even then a late row
    /// (WAL replay after a long stop) can make the writer merge a sealed file
    /// into a new one, which lists it in `vtax.compacted_from`.
    pub fn is_sealed(&self, partition: &[FileInfo], now_us: i64, settle_us: i64) -> bool {
        let Some(&last_hour) = self.watermarks.keys().next_back() else {
            return false;
        };
        if (last_hour + 1) * HOUR_US + settle_us > now_us {
            return false;
        }
        if self.watermarks.len() > 1 {
            return true;
        }
        !partition.iter().any(|other| {
            other.path != self.path
                && other.watermarks.len() == 1
                && other.watermarks.contains_key(&last_hour)
        })
    }
}

/// The published files of a store, as a glob of `*.parquet` sees them and
/// without its lock: files that a published merged file replaces are left
/// out, and so are files that vanish or fail to read while being listed (a
/// writer merging them away or quarantining them at that moment). A merged
/// file still under its pending name is not among them, and the inputs it
/// has not yet deleted are: they are what a glob reads until it is published.
pub fn live_files(data_dir: &Path) -> Result<Vec<FileInfo>> {
    Ok(live_and_unreadable_files(data_dir)?.0)
}

/// Published files whose footer did not read, and why.
pub type Unreadable = Vec<(PathBuf, Error)>;

/// [`live_files`], and the published files whose footer did not read and
/// that are still there after the listing: damage (`vtax verify` says which
/// and quarantines it), which a reader of the whole store does not get.
pub fn live_and_unreadable_files(data_dir: &Path) -> Result<(Vec<FileInfo>, Unreadable)> {
    let (mut listed, _) = list_files(data_dir)?;
    listed.retain(|f| !f.pending);
    let mut unreadable = Vec::new();
    let index = index_files(listed, |file, e| {
        if file.path.exists() {
            unreadable.push((file.path.clone(), e));
        }
        Ok(())
    })?;
    Ok((index.live.into_values().flatten().collect(), unreadable))
}

/// Ending of a merged file's name while its merge commits, after the
/// published name: see [`pending_name`].
const PENDING_SUFFIX: &str = ".pending";

/// The name a merged file is written under until its inputs are deleted,
/// `.<name>.pending` for the published `<name>`: hidden, and not ending in
/// `.parquet`. The documented globs (`*.parquet`, `**/*.parquet`) never match
/// it, and readers of a whole directory (pyarrow's and pandas' datasets,
/// Spark) pass over hidden files, so the same rows are never read both from
/// it and from its inputs. Renamed to `<name>` once every input is deleted.
pub fn pending_name(name: &str) -> String {
    format!(".{name}{PENDING_SUFFIX}")
}

/// The published name of a pending file's name ([`pending_name`]); `None`
/// for any other name.
pub fn published_name(name: &str) -> Option<&str> {
    name.strip_prefix('.')?
        .strip_suffix(PENDING_SUFFIX)
        .filter(|n| n.ends_with(".parquet") && !n.starts_with('.'))
}

/// Publishes a merged file written under its pending name ([`pending_name`])
/// in the store at `data_dir`, once its inputs are deleted: renames it to
/// its published name and fsyncs the directory. Returns its new path. The
/// rename goes through the partition's descriptor, opened from `data_dir`
/// without following a link: by path, the store's owner could swap the
/// partition for a link between the merge's write and its publish, and root
/// renamed a pending file of the owner's over a file of root's.
pub(crate) fn publish_pending(data_dir: &Path, path: &Path) -> Result<PathBuf> {
    use crate::regular_file::{c_name, open_dirs_below, rename_at};
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let (Some(published), Some(dir)) = (published_name(name), path.parent()) else {
        return Err(Error::Corrupt {
            path: path.to_owned(),
            reason: "not the name of a pending merged file".into(),
        });
    };
    let target = path.with_file_name(published);
    let renamed = || -> std::io::Result<()> {
        let partition = open_dirs_below(data_dir, dir, false)?;
        rename_at(
            &partition,
            &c_name(name.as_ref())?,
            &partition,
            &c_name(published.as_ref())?,
        )?;
        partition.sync_all()
    };
    renamed().map_err(Error::io("rename", path))?;
    Ok(target)
}

/// Directory of a table's partition for `day`.
pub fn partition_dir(data_dir: &Path, table: &str, day: i64) -> PathBuf {
    data_dir
        .join("tables")
        .join(table)
        .join(format!("date={}", date_string(day)))
}
