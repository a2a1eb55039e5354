//! Reading files back: their metadata and watermarks, the listing of a
//! store or a fleet copy, the layout and page checks, and batches for a scan.

use super::*;

/// Checks the file at `path` against its `vtax.pages_crc32`: reads the bytes
/// it covers again and sums them.
pub(crate) fn check_pages_crc32(path: &Path, sum: (u64, u32)) -> Result<()> {
    let file = open_regular(path)?;
    check_pages_crc32_of(&file, path, sum)
}

/// [`check_pages_crc32`] on a file already open (a reader keeps each file
/// open from its footer to its rows, so a merge that removes it meanwhile
/// does not fail the check). Reads at offsets: the handle's position, which
/// its clones share, is left alone.
pub(crate) fn check_pages_crc32_of(file: &File, path: &Path, sum: (u64, u32)) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut pages = PagesSum::new(path, Some(sum));
    let mut buffer = vec![0u8; 256 << 10];
    let mut read = 0u64;
    while read < sum.0 {
        let want = buffer.len().min((sum.0 - read) as usize);
        let n = file
            .read_at(&mut buffer[..want], read)
            .map_err(Error::io("read", path))?;
        if n == 0 {
            break;
        }
        pages.update(&buffer[..n]);
        read += n as u64;
    }
    pages.finish()
}

/// The check of a file's bytes against its `vtax.pages_crc32`, fed the
/// bytes in order by whoever reads them anyway: an upload sums the bytes it
/// sends, so that a file whose bytes changed since they were written is not
/// sent on as sound.
pub struct PagesSum {
    path: PathBuf,
    expected: Option<(u64, u32)>,
    hasher: crc32fast::Hasher,
    summed_bytes: u64,
}

impl PagesSum {
    /// A check of the file at `path` against `expected` (its
    /// [`FileInfo::pages_crc32`]); none passes every file.
    pub fn new(path: &Path, expected: Option<(u64, u32)>) -> PagesSum {
        PagesSum {
            path: path.to_owned(),
            expected,
            hasher: crc32fast::Hasher::new(),
            summed_bytes: 0,
        }
    }

    /// Takes the next bytes of the file; those past the pages are not summed.
    pub fn update(&mut self, chunk: &[u8]) {
        let Some((bytes, _)) = self.expected else {
            return;
        };
        let take = (bytes.saturating_sub(self.summed_bytes)).min(chunk.len() as u64) as usize;
        self.hasher.update(&chunk[..take]);
        self.summed_bytes += take as u64;
    }

    /// Whether the bytes taken are the pages that were written.
    pub fn finish(self) -> Result<()> {
        let Some((bytes, crc)) = self.expected else {
            return Ok(());
        };
        let found = self.hasher.finalize();
        if self.summed_bytes != bytes || found != crc {
            return Err(Error::Corrupt {
                path: self.path,
                reason: format!(
                    "its first {bytes} bytes (magic and pages) sum to CRC-32 {found:08x} over \
                     {} bytes read, not the {crc:08x} written: a byte changed since",
                    self.summed_bytes
                ),
            });
        }
        Ok(())
    }
}

pub(super) fn parse_watermarks(text: &str) -> Option<BTreeMap<i64, u64>> {
    let mut out = BTreeMap::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (hour, seq) = pair.split_once(':')?;
        out.insert(hour.parse().ok()?, seq.parse().ok()?);
    }
    Some(out)
}

/// Reads a file's footer and checks that it is a file of `table` in partition `day`.
pub fn read_info(path: &Path, table: &str, day: i64) -> Result<FileInfo> {
    let file = open_regular(path)?;
    read_info_of(file, path, table, day)
}

pub(super) fn read_info_of(file: File, path: &Path, table: &str, day: i64) -> Result<FileInfo> {
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let bytes = file.metadata().map_err(Error::io("stat", path))?.len();
    let reader = SerializedFileReader::new(file).map_err(|e| corrupt(e.to_string()))?;
    let meta = reader.metadata();
    check_layout(meta, bytes).map_err(corrupt)?;
    let kv: BTreeMap<&str, &str> = meta
        .file_metadata()
        .key_value_metadata()
        .map(|kvs| {
            kvs.iter()
                .filter_map(|kv| Some((kv.key.as_str(), kv.value.as_deref()?)))
                .collect()
        })
        .unwrap_or_default();
    if kv.get(keys::TABLE).copied() != Some(table) {
        return Err(corrupt(format!("not a file of table {table}")));
    }
    let watermarks = kv
        .get(keys::WATERMARKS)
        .and_then(|w| parse_watermarks(w))
        .ok_or_else(|| corrupt("missing or bad watermarks".into()))?;
    if watermarks
        .keys()
        .any(|hour| (hour * HOUR_US).div_euclid(crate::DAY_US) != day)
    {
        return Err(corrupt("holds hours outside its date partition".into()));
    }
    let node = kv
        .get(keys::NODE)
        .ok_or_else(|| corrupt("missing node".into()))?
        .to_string();
    let names = |key: &str| -> Vec<String> {
        kv.get(key)
            .map(|s| s.split(',').map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let compacted_from = names(keys::COMPACTED_FROM);
    let compacted_intermediates = names(keys::COMPACTED_INTERMEDIATES);
    let mut time_range_us: Option<(i64, i64)> = None;
    for rg in meta.row_groups() {
        if let Some(parquet::file::statistics::Statistics::Int64(s)) = rg.column(0).statistics() {
            if let (Some(&lo), Some(&hi)) = (s.min_opt(), s.max_opt()) {
                time_range_us = Some(match time_range_us {
                    None => (lo, hi),
                    Some((a, b)) => (a.min(lo), b.max(hi)),
                });
            }
        }
    }
    let pages_crc32 = match kv.get(keys::PAGES_CRC32) {
        None => None,
        Some(text) => Some(
            text.split_once(':')
                .and_then(|(n, crc)| Some((n.parse().ok()?, u32::from_str_radix(crc, 16).ok()?)))
                .filter(|&(n, _)| n <= bytes)
                .ok_or_else(|| corrupt(format!("bad {}: {text:?}", keys::PAGES_CRC32)))?,
        ),
    };
    Ok(FileInfo {
        path: path.to_owned(),
        table: table.to_owned(),
        day,
        node,
        bytes,
        rows: meta.file_metadata().num_rows() as u64,
        watermarks,
        compacted_from,
        compacted_intermediates,
        time_range_us,
        pages_crc32,
    })
}

/// A file in the tables tree, before its footer is read.
pub(crate) struct Listed {
    pub path: PathBuf,
    pub table: String,
    pub day: i64,
    /// A merged file under its pending name ([`pending_name`]).
    pub pending: bool,
}

/// Lists published and pending files (and, separately, strays: temp files,
/// and pending files whose published twin is there too).
pub(crate) fn list_files(data_dir: &Path) -> Result<(Vec<Listed>, Vec<PathBuf>)> {
    list_node_files(data_dir, None)
}

/// Lists published and pending files of one node's store, or with `node`, of
/// that node in a fleet copy (`tables/<table>/node=<node>/date=.../`). The
/// strays, returned apart, are what no reader reads and an open removes:
/// temp files of a publish that did not finish, and a pending file listed
/// beside its own published name (renamed while the directory was read, or
/// copied so by a tool): one file, read under its published name.
pub(crate) fn list_node_files(
    data_dir: &Path,
    node: Option<&str>,
) -> Result<(Vec<Listed>, Vec<PathBuf>)> {
    let mut files = Vec::new();
    let mut temps = Vec::new();
    let tables = data_dir.join("tables");
    let read = |dir: &Path| -> Result<Vec<fs::DirEntry>> {
        match fs::read_dir(dir) {
            Ok(entries) => entries
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(Error::io("list", dir)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(Error::io("list", dir)(e)),
        }
    };
    // Below `tables/`, an entry that is no directory (a README, a file
    // under a partition's name) holds no files of the store, and one that
    // cannot be listed (its permissions) holds none that can be read: each
    // is passed over, the second named in the log. Either failed the whole
    // listing, and with it the agent's start and every command that could
    // have mended the store.
    let read_below = |dir: &Path| -> Vec<fs::DirEntry> {
        match read(dir) {
            Ok(entries) => entries,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotADirectory => {
                Vec::new()
            }
            Err(e) => {
                tracing::error!(error = %e, "A directory of the store could not be listed: its files are left out until it can be.");
                Vec::new()
            }
        }
    };
    // A link below `tables/` is not followed (`foreign_partitions` names
    // it): retention, quarantine and the removal of strays would act on
    // what it points to, outside the store, for a command run as root.
    let linked = |entry: &fs::DirEntry| entry.file_type().is_ok_and(|t| t.is_symlink());
    for table in read(&tables)? {
        let Some(table_name) = table.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if linked(&table) {
            continue;
        }
        let table_dir = match node {
            Some(node) => table.path().join(format!("node={node}")),
            None => table.path(),
        };
        if table_dir
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
        {
            continue;
        }
        for part in read_below(&table_dir) {
            if linked(&part) {
                continue;
            }
            let name = part.file_name();
            let Some(day) = name
                .to_str()
                .and_then(|n| n.strip_prefix("date="))
                .and_then(parse_date)
            else {
                continue;
            };
            let mut names = Vec::new();
            let mut dirs = std::collections::HashSet::new();
            for file in read_below(&part.path()) {
                if let Ok(name) = file.file_name().into_string() {
                    if file.file_type().is_ok_and(|t| t.is_dir()) {
                        dirs.insert(name.clone());
                    }
                    names.push((name, file.path()));
                }
            }
            let published: std::collections::HashSet<&str> = names
                .iter()
                .map(|(name, _)| name.as_str())
                .filter(|name| name.ends_with(".parquet"))
                .collect();
            for (name, path) in &names {
                let pending = published_name(name);
                // Only a publish's own temporary name (`.<file>.parquet.tmp`):
                // another `.tmp` there is someone else's to keep.
                let temp = name.starts_with('.')
                    && name.ends_with(".parquet.tmp")
                    && !dirs.contains(name.as_str());
                if temp || pending.is_some_and(|p| published.contains(p)) {
                    temps.push(path.clone());
                } else if pending.is_some() || name.ends_with(".parquet") {
                    files.push(Listed {
                        path: path.clone(),
                        table: table_name.clone(),
                        day,
                        pending: pending.is_some(),
                    });
                }
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((files, temps))
}

/// Every directory under a table of the store at `data_dir`, as (table,
/// directory name, path), in order: the partitions and whatever else lies
/// there, for the checks of `vtax verify`.
pub fn partition_dirs(data_dir: &Path) -> Vec<(String, String, PathBuf)> {
    let mut found = Vec::new();
    let Ok(tables) = fs::read_dir(data_dir.join("tables")) else {
        return found;
    };
    for table in tables.flatten() {
        let Ok(partitions) = fs::read_dir(table.path()) else {
            continue;
        };
        let table_name = table.file_name().to_string_lossy().into_owned();
        for partition in partitions.flatten() {
            let name = partition.file_name().to_string_lossy().into_owned();
            found.push((table_name.clone(), name, partition.path()));
        }
    }
    found.sort();
    found
}

/// Directories under a table of the store at `data_dir` whose names are no
/// partition (`date=YYYY-MM-DD` of a real date) and that hold Parquet files,
/// with how many, and symbolic links in place of a table or a partition. The
/// store reads none of their rows, while a glob over
/// `tables/<table>/*/*.parquet` (DuckDB, Polars) reads them all: the two
/// would disagree without a word, so the agent's start and `vtax verify`
/// name them.
pub fn foreign_partitions(data_dir: &Path) -> Vec<ForeignDir> {
    let is_link = |path: &Path| {
        path.symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
    };
    let parquet_files = |path: &Path| {
        fs::read_dir(path)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|f| {
                        f.file_name()
                            .to_str()
                            .is_some_and(|n| n.ends_with(".parquet"))
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    let mut found = Vec::new();
    let mut linked_tables = std::collections::BTreeSet::new();
    if let Ok(tables) = fs::read_dir(data_dir.join("tables")) {
        for table in tables.flatten() {
            if table.file_type().is_ok_and(|t| t.is_symlink()) {
                linked_tables.insert(table.file_name().to_string_lossy().into_owned());
                found.push(ForeignDir {
                    path: table.path(),
                    parquet_files: 0,
                    linked: true,
                });
            }
        }
    }
    for (table, name, path) in partition_dirs(data_dir) {
        if linked_tables.contains(&table) {
            continue;
        }
        if is_link(&path) {
            let parquet_files = parquet_files(&path);
            found.push(ForeignDir {
                path,
                parquet_files,
                linked: true,
            });
            continue;
        }
        let dated = name
            .strip_prefix("date=")
            .and_then(crate::parse_date)
            .is_some();
        let parquet_files = if dated { 0 } else { parquet_files(&path) };
        if parquet_files > 0 {
            found.push(ForeignDir {
                path,
                parquet_files,
                linked: false,
            });
        }
    }
    found
}

/// A directory under `tables/` whose files the store does not read.
#[derive(Debug, PartialEq)]
pub struct ForeignDir {
    /// Where it is.
    pub path: PathBuf,
    /// The Parquet files it holds, which a glob of the table reads.
    pub parquet_files: usize,
    /// A symbolic link (a table's or a partition's), which the store does
    /// not follow; otherwise a directory not named as a partition.
    pub linked: bool,
}

/// The node that wrote a store, as its newest file's footer (`vtax.node`)
/// names it, for commands that write beside the agent (`vtax compact`) and
/// readers that label a store. `None` for a store without readable files.
///
/// The newest file is the one last written (modification time): file names
/// are `<node>-<first_time_us>-<max_seq>[-<n>].parquet`, and since a node
/// name may hold '-' and end in digits (`gpu-node-17`), a name alone does not
/// say where the node ends, so the footer says which node wrote it.
pub fn node_of_store(data_dir: &Path) -> Result<Option<String>> {
    let (files, _) = list_files(data_dir)?;
    let mut newest: Vec<(std::time::SystemTime, &Listed)> = files
        .iter()
        .filter_map(|f| Some((f.path.metadata().ok()?.modified().ok()?, f)))
        .collect();
    newest.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.path.cmp(&a.1.path)));
    // A file merged away or damaged since the listing: the next newest says.
    Ok(newest
        .into_iter()
        .find_map(|(_, f)| read_info(&f.path, &f.table, f.day).ok())
        .map(|info| info.node))
}

/// Live files by partition (table, day), and the files that a merged file
/// in the same partition replaces, set aside: those are an interrupted merge's
/// inputs, which a writer deletes and a reader ignores. A merged file under
/// its pending name is live: it holds every row of its inputs, which it
/// replaces from the moment it is there (a glob reads the inputs until it is
/// published, and never both).
pub(crate) struct FileIndex {
    pub live: BTreeMap<(String, i64), Vec<FileInfo>>,
    pub replaced: Vec<FileInfo>,
}

/// Opens a listed store file. Something else under a store file's name (a
/// FIFO, whose open would wait for a writer; a directory; a device) is no
/// file of the store: damage, which quarantine moves aside.
pub(crate) fn open_regular(path: &Path) -> Result<File> {
    crate::regular_file::open_read(path).map_err(|e| {
        let corrupt = |reason: &str| Error::Corrupt {
            path: path.to_owned(),
            reason: reason.into(),
        };
        match e.kind() {
            std::io::ErrorKind::InvalidData => corrupt("not a regular file"),
            // Not a file a merge removed under a read (which a scan retries
            // until the listing settles): a link that leads nowhere, for
            // ever. Read as gone, it made every scan of its table fail as
            // "changed under the read", and `vtax verify` pass it over.
            std::io::ErrorKind::NotFound if fs::symlink_metadata(path).is_ok() => {
                corrupt("a symbolic link to a file that is not there")
            }
            _ => Error::io("open", path)(e),
        }
    })
}

/// Reads the footer of every listed file into a [`FileIndex`]. A file whose
/// footer fails goes to `on_unreadable`, which decides what becomes of it.
pub(crate) fn index_files(
    listed: Vec<Listed>,
    on_unreadable: impl FnMut(&Listed, Error) -> Result<()>,
) -> Result<FileIndex> {
    Ok(index_files_kept(listed, 0, on_unreadable)?.0)
}

/// [`index_files`], and the first `keep_open` files read stay open: a reader
/// beside a writer then reads them even if a merge removes them meanwhile.
pub(crate) fn index_files_kept(
    listed: Vec<Listed>,
    keep_open: usize,
    mut on_unreadable: impl FnMut(&Listed, Error) -> Result<()>,
) -> Result<(FileIndex, HashMap<PathBuf, File>)> {
    let mut infos = Vec::new();
    let mut kept = HashMap::new();
    for file in listed {
        let opened = open_regular(&file.path).and_then(|f| {
            if kept.len() < keep_open {
                let copy = f.try_clone().map_err(Error::io("open", &file.path))?;
                kept.insert(file.path.clone(), copy);
            }
            read_info_of(f, &file.path, &file.table, file.day)
        });
        match opened {
            Ok(info) => infos.push(info),
            Err(e) => {
                kept.remove(&file.path);
                on_unreadable(&file, e)?
            }
        }
    }
    let replaced_names: std::collections::HashSet<(String, i64, String)> = infos
        .iter()
        .flat_map(|f| {
            f.compacted_from
                .iter()
                .map(|name| (f.table.clone(), f.day, name.clone()))
        })
        .collect();
    let mut index = FileIndex {
        live: BTreeMap::new(),
        replaced: Vec::new(),
    };
    for info in infos {
        let name = info.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if replaced_names.contains(&(info.table.clone(), info.day, name.to_owned())) {
            index.replaced.push(info);
        } else {
            index
                .live
                .entry((info.table.clone(), info.day))
                .or_default()
                .push(info);
        }
    }
    Ok((index, kept))
}

/// Checks that a file's metadata describes a layout that fits the file: every
/// column chunk inside its `file_bytes`, and, where the page index was read,
/// every page inside its column chunk, in order, with a page of statistics
/// for each. The Parquet reader trusts these numbers and panics on some
/// nonsense ones (a negative offset, a page before its chunk), so a file whose
/// footer decoded but was damaged must be caught here, with its reason.
pub fn check_layout(meta: &ParquetMetaData, file_bytes: u64) -> std::result::Result<(), String> {
    // Pages lie after the leading magic and before the footer's length and magic.
    let data_end = file_bytes.saturating_sub(8) as i64;
    let page_index = meta.page_index();
    let mut rows_in_groups: i64 = 0;
    for (g, rg) in meta.row_groups().iter().enumerate() {
        if rg.num_rows() < 0 {
            return Err(format!("row group {g} has {} rows", rg.num_rows()));
        }
        rows_in_groups = rows_in_groups.saturating_add(rg.num_rows());
        for (c, chunk) in rg.columns().iter().enumerate() {
            let at = || format!("row group {g}, column {c}");
            let data = chunk.data_page_offset();
            let start = chunk.dictionary_page_offset().unwrap_or(data);
            let len = chunk.compressed_size();
            let end = start.checked_add(len).unwrap_or(i64::MAX);
            if start < 4 || len < 0 || data < start || data >= end || end > data_end {
                return Err(format!(
                    "{}: bytes {start}..{end} (data pages from {data}) do not fit the \
                     file's {file_bytes} bytes",
                    at()
                ));
            }
            if chunk.num_values() < 0 {
                return Err(format!("{}: {} values", at(), chunk.num_values()));
            }
            let Some(index) = page_index else { continue };
            let offsets = index.offset_index(g, c);
            if let Some(offsets) = offsets {
                let mut next_byte = data;
                let mut next_row = 0;
                for (p, page) in offsets.page_locations().iter().enumerate() {
                    let page_end = page
                        .offset
                        .saturating_add(i64::from(page.compressed_page_size));
                    let first_row_fits = if p == 0 {
                        page.first_row_index == 0
                    } else {
                        page.first_row_index >= next_row && page.first_row_index < rg.num_rows()
                    };
                    if page.offset < next_byte
                        || page.compressed_page_size <= 0
                        || page_end > end
                        || !first_row_fits
                    {
                        return Err(format!(
                            "{}, page {p}: bytes {}..{page_end} from row {} do not fit \
                             the column chunk's bytes {data}..{end} and its {} rows",
                            at(),
                            page.offset,
                            page.first_row_index,
                            rg.num_rows()
                        ));
                    }
                    next_byte = page_end;
                    next_row = page.first_row_index + 1;
                }
            }
            if let (Some(stats), Some(offsets)) = (index.column_index(g, c), offsets) {
                let pages = offsets.page_locations().len() as u64;
                if stats.num_pages() != pages {
                    return Err(format!(
                        "{}: page statistics for {} pages, locations for {pages}",
                        at(),
                        stats.num_pages()
                    ));
                }
            }
        }
    }
    if rows_in_groups != meta.file_metadata().num_rows() {
        return Err(format!(
            "its row groups hold {rows_in_groups} rows, its footer says {}",
            meta.file_metadata().num_rows()
        ));
    }
    Ok(())
}

/// Opens the file at `path` for a reader: its footer and page index, with
/// their layout checked against the file ([`check_layout`]) before the Parquet
/// reader, which trusts them, is given them. Every scan, merge and
/// verification opens a file through here.
pub(crate) fn open_for_reading(path: &Path) -> Result<(File, ArrowReaderMetadata)> {
    load_for_reading(open_regular(path)?, path)
}

/// [`open_for_reading`] of a file already open.
pub(crate) fn load_for_reading(file: File, path: &Path) -> Result<(File, ArrowReaderMetadata)> {
    let file_bytes = file.metadata().map_err(Error::io("stat", path))?.len();
    // The offset index lets a reader that starts mid-file skip whole pages.
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    let metadata = ArrowReaderMetadata::load(&file, options).map_err(|source| Error::Parquet {
        path: path.to_owned(),
        source,
    })?;
    check_layout(metadata.metadata(), file_bytes).map_err(|reason| Error::Corrupt {
        path: path.to_owned(),
        reason,
    })?;
    Ok((file, metadata))
}

/// Reads every page of every column of the file at `path`, as a scan of all
/// of it would, and checks it holds the `rows` its footer promised. A file
/// whose footer is whole can still hold a damaged page that only a read of
/// that page meets; this finds it before a query does.
pub fn verify_file(info: &FileInfo) -> Result<()> {
    let (path, rows) = (info.path.as_path(), info.rows);
    if let Some(sum) = info.pages_crc32 {
        check_pages_crc32(path, sum)?;
    }
    let (file, metadata) = open_for_reading(path)?;
    let mut reader = FileBatches::new(file, path, metadata, |b| b.with_batch_size(64 * 1024))?;
    let mut read = 0u64;
    while let Some(batch) = reader.next(path) {
        read += batch?.num_rows() as u64;
    }
    if read != rows {
        return Err(Error::Corrupt {
            path: path.to_owned(),
            reason: format!("{read} rows read, its footer says {rows}"),
        });
    }
    Ok(())
}

/// What [`verify_store`] found.
#[derive(Debug)]
pub struct Verified {
    /// Published files read whole without a fault.
    pub sound: usize,
    /// Files that could not be read whole, each as its error (naming it).
    pub damaged: Vec<Error>,
    /// Sound files still under a merge's pending name: a merge stopped
    /// after it removed its inputs and before it published its output. The
    /// store's next open publishes them; until then readers that know only
    /// `*.parquet` (DuckDB, Polars, Spark) do not see their rows.
    pub unfinished_merges: Vec<PathBuf>,
}

/// Reads every live file of the store at `data_dir` whole (published, or
/// merged and still under its pending name): its footer and layout, as
/// opening the store does, then every page ([`verify_file`]). Takes no lock,
/// so it runs beside an agent; a file that a merge removes meanwhile is
/// passed over.
pub fn verify_store(data_dir: &Path) -> Result<Verified> {
    let (listed, _) = list_files(data_dir)?;
    let mut damaged = Vec::new();
    let index = index_files(listed, |_, e| {
        if !e.is_not_found() {
            damaged.push(e);
        }
        Ok(())
    })?;
    let mut sound = 0;
    let mut unfinished_merges = Vec::new();
    // A pending file whose inputs are still there is a merge under way. One
    // stopped while it deleted its inputs (some gone, some there) reads as
    // under way too: its output still holds every row, and the store's
    // next open finishes it.
    let inputs_present: std::collections::HashSet<&str> = index
        .replaced
        .iter()
        .filter_map(|f| f.path.file_name().and_then(|n| n.to_str()))
        .collect();
    for info in index.live.values().flatten() {
        match verify_file(info) {
            Ok(()) => {
                sound += 1;
                let name = info.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let under_way = info
                    .compacted_from
                    .iter()
                    .any(|input| inputs_present.contains(input.as_str()));
                if published_name(name).is_some() && !under_way {
                    unfinished_merges.push(info.path.clone());
                }
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => damaged.push(e),
        }
    }
    Ok(Verified {
        sound,
        damaged,
        unfinished_merges,
    })
}

/// Where the Parquet reader reads a file's pages from. The reader passes an
/// OS error on only as text, like a damaged page's; this keeps the OS's error
/// code, so that a disk failing a read is not taken for a damaged file (and
/// the file is not quarantined for it).
pub(crate) struct PageSource {
    pub(super) file: File,
    pub(super) os_error: Arc<AtomicI32>,
}

impl PageSource {
    pub(super) fn note(os_error: &AtomicI32, e: &std::io::Error) {
        if let Some(code) = e.raw_os_error() {
            os_error.store(code, Ordering::Relaxed);
        }
    }

    pub(super) fn note_parquet(&self, e: &parquet::errors::ParquetError) {
        if let Some(io) = crate::error::os_error(e) {
            Self::note(&self.os_error, io);
        }
    }
}

impl parquet::file::reader::Length for PageSource {
    fn len(&self) -> u64 {
        self.file.len()
    }
}

impl parquet::file::reader::ChunkReader for PageSource {
    type T = WatchedRead<std::io::BufReader<File>>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let inner = self
            .file
            .get_read(start)
            .inspect_err(|e| self.note_parquet(e))?;
        Ok(WatchedRead {
            inner,
            os_error: self.os_error.clone(),
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        self.file
            .get_bytes(start, length)
            .inspect_err(|e| self.note_parquet(e))
    }
}

/// A reader of page headers that keeps the OS's error code of a failed read.
pub(crate) struct WatchedRead<R> {
    pub(super) inner: R,
    pub(super) os_error: Arc<AtomicI32>,
}

impl<R: std::io::Read> std::io::Read for WatchedRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner
            .read(buf)
            .inspect_err(|e| PageSource::note(&self.os_error, e))
    }
}

/// Batches of one Parquet file, read through a [`PageSource`].
pub(crate) struct FileBatches {
    pub(super) reader: ParquetRecordBatchReader,
    pub(super) os_error: Arc<AtomicI32>,
}

impl FileBatches {
    /// A reader of `file` (the file at `path`, whose footer is `metadata`),
    /// set up by `configure`: row groups, selection, projection, batch size.
    pub(crate) fn new(
        file: File,
        path: &Path,
        metadata: ArrowReaderMetadata,
        configure: impl FnOnce(
            ParquetRecordBatchReaderBuilder<PageSource>,
        ) -> ParquetRecordBatchReaderBuilder<PageSource>,
    ) -> Result<FileBatches> {
        let os_error = Arc::new(AtomicI32::new(0));
        let source = PageSource {
            file,
            os_error: os_error.clone(),
        };
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(source, metadata);
        let reader = configure(builder)
            .build()
            .map_err(|source| Error::Parquet {
                path: path.to_owned(),
                source,
            })?;
        Ok(FileBatches { reader, os_error })
    }

    /// The next batch of the file at `path`. The Parquet reader trusts each
    /// page's header and panics on some damaged ones (a count that overruns
    /// its page); that panic becomes the file's `Corrupt` error, so a damaged
    /// page fails the scan or merge that met it, naming the file, instead of
    /// taking the agent or `vtax query` down. A failed read of the disk is
    /// an `Io` error, not damage.
    pub(crate) fn next(&mut self, path: &Path) -> Option<Result<RecordBatch>> {
        let reader = &mut self.reader;
        let batch = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.next())) {
            Ok(None) => return None,
            Ok(Some(batch)) => batch,
            Err(payload) => {
                return Some(Err(Error::Corrupt {
                    path: path.to_owned(),
                    reason: format!(
                        "a page could not be decoded: {}",
                        crate::error::panic_message(payload.as_ref())
                    ),
                }))
            }
        };
        Some(
            batch.map_err(|e| match self.os_error.load(Ordering::Relaxed) {
                0 => Error::Parquet {
                    path: path.to_owned(),
                    source: e.into(),
                },
                code => Error::Io {
                    op: "read pages of",
                    path: path.to_owned(),
                    source: std::io::Error::from_raw_os_error(code),
                },
            }),
        )
    }
}
