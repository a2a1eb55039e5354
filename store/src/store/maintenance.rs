//! Merges, quarantine and retention of the published files: which files
//! merge, the merge's commit (safe to kill at any instant), and what
//! retention may delete.

use super::*;

/// A merge [`Store::plan_merges`] planned. Its inputs are published files,
/// which nothing changes in place, and it writes one new file, so it runs on
/// any thread while the store appends and publishes.
pub struct Merge {
    pub(super) data_dir: PathBuf,
    pub(super) node: String,
    pub(super) options: WriteOptions,
    pub(super) partition: (String, i64),
    pub(super) table: &'static crate::TableDef,
    pub(super) inputs: Vec<FileInfo>,
    pub(super) first_time: i64,
    pub(super) watermarks: BTreeMap<i64, u64>,
    pub(super) names: Vec<String>,
    pub(super) intermediates: Vec<String>,
    pub(super) replaced: Arc<HashSet<String>>,
    /// Whether rows whose tags and time equal another's are merged into one.
    pub(super) dedupe: bool,
    /// [`Store::kill_merges_at`]'s step when the merge was planned.
    pub(super) kill_step: Option<usize>,
}

/// What [`Merge::run`] did, for [`Store::finish_merge`].
pub struct MergeOutcome {
    pub(super) merge: Merge,
    pub(super) output: Result<FileInfo>,
    /// Rows it left out as repeats of a series and time another input held.
    pub(super) repeated_rows: u64,
    /// Whether it got as far as writing: only then is a failure a write error
    /// (an input whose footer cannot be read is not).
    pub(super) writing: bool,
}

impl Merge {
    /// The files this merge replaces.
    pub fn inputs(&self) -> &[FileInfo] {
        &self.inputs
    }

    /// Writes the merged file, atomically (see [`files::publish`]), under its
    /// pending name; its inputs stay until [`Store::finish_merge`] commits it.
    /// Once `keep_going` turns false the merge stops at its next column and
    /// writes nothing.
    pub fn run(self, keep_going: &AtomicBool) -> MergeOutcome {
        let (output, writing) =
            match crate::merge::MergeColumns::open(self.table, &self.inputs, self.dedupe) {
                Ok(merge) => (self.write(merge, keep_going), true),
                Err(e) => (Err(e), false),
            };
        let (output, repeated_rows) = match output {
            Ok((info, repeated)) => (Ok(info), repeated),
            Err(e) => (Err(e), 0),
        };
        MergeOutcome {
            merge: self,
            output,
            repeated_rows,
            writing,
        }
    }

    pub(super) fn write(
        &self,
        merge: crate::merge::MergeColumns,
        keep_going: &AtomicBool,
    ) -> Result<(FileInfo, u64)> {
        let mut source = Stoppable {
            source: merge,
            keep_going,
            kill_step: self.kill_step,
        };
        // A publish beside this merge names its file after a sequence number
        // above every watermark the inputs hold, so the two never pick one name.
        let info = files::publish(
            &self.data_dir,
            &self.node,
            self.table,
            self.first_time,
            &mut source,
            &self.watermarks,
            &self.names,
            &self.intermediates,
            &self.options,
            &|name| self.replaced.contains(name),
            files::PublishAs::Pending,
        )?;
        let duplicates = source.source.duplicates();
        if duplicates > 0 {
            tracing::info!(path = %info.path.display(), duplicates, "Merged rows that repeat a series and time: the first kept.");
        }
        Ok((info, duplicates))
    }
}

impl MergeOutcome {
    /// The merge's error, if it failed or was stopped.
    pub fn error(&self) -> Option<&Error> {
        self.output.as_ref().err()
    }
}

/// A column source that gives up once told to: a stopping agent does not wait
/// for a day's merge.
pub(super) struct Stoppable<'a, S> {
    pub(super) source: S,
    pub(super) keep_going: &'a AtomicBool,
    pub(super) kill_step: Option<usize>,
}

impl<S: files::ColumnSource> Stoppable<'_, S> {
    pub(super) fn check(&self) -> Result<()> {
        if self.keep_going.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(Error::Stopped)
        }
    }
}

impl<S: files::ColumnSource> files::ColumnSource for Stoppable<'_, S> {
    fn next_row_group(&mut self, max_rows: usize) -> Result<usize> {
        self.check()?;
        self.source.next_row_group(max_rows)
    }

    fn column(
        &mut self,
        column: usize,
        sink: &mut dyn FnMut(arrow_array::ArrayRef) -> Result<()>,
    ) -> Result<()> {
        self.check()?;
        // Past the first column, so the temp file holds some of the rows.
        if column > 0 {
            kill_point(self.kill_step, 0);
        }
        self.source.column(column, sink)
    }
}

/// Stops dead at `step` of a merge if `kill_step` says so (see
/// [`Store::kill_merges_at`]): a panic, so nothing after it runs.
pub(super) fn kill_point(kill_step: Option<usize>, step: usize) {
    if kill_step == Some(step) {
        panic!("a merge killed at step {step}, as a test asked");
    }
}

/// Removes the file at `path`; one already gone is fine.
pub(super) fn remove_if_there(path: &Path, op: &'static str) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(op, path)(e)),
        _ => Ok(()),
    }
}

/// Reads whole, at open, each merged file whose inputs are still there (a
/// merge a kill interrupted), before [`finish_interrupted_merges`] deletes
/// them: its footer read, so it replaced them in the index, but a file
/// damaged since it was written (a zeroed block, a failing disk) then stood
/// alone, and every row of its inputs was lost with them. A damaged one
/// leaves the index and is returned, to be quarantined; its inputs are live
/// again. One that cannot be read (permissions) stays where it is, out of
/// the index, and its inputs are kept too.
pub(super) fn keep_inputs_of_damaged_merges(index: &mut files::FileIndex) -> Vec<FileInfo> {
    let mut damaged = Vec::new();
    let mut kept_inputs: Vec<(String, i64, String)> = Vec::new();
    for files in index.live.values_mut() {
        files.retain(|merged| {
            let has_inputs = merged.compacted_from.iter().any(|name| {
                index.replaced.iter().any(|input| {
                    input.table == merged.table
                        && input.day == merged.day
                        && input.path.file_name().and_then(|n| n.to_str()) == Some(name)
                })
            });
            if !has_inputs {
                return true;
            }
            let Err(e) = files::verify_file(merged) else {
                return true;
            };
            kept_inputs.extend(
                merged
                    .compacted_from
                    .iter()
                    .map(|name| (merged.table.clone(), merged.day, name.clone())),
            );
            if e.damaged_file().is_some() {
                tracing::error!(path = %merged.path.display(), error = %e, "A merged file whose inputs are still there failed verification: it goes to quarantine and its inputs stay.");
                damaged.push(merged.clone());
            } else {
                tracing::error!(path = %merged.path.display(), error = %e, "A merged file whose inputs are still there could not be read: it stays where it is, out of the index, and its inputs stay.");
            }
            false
        });
    }
    let (kept, replaced): (Vec<FileInfo>, Vec<FileInfo>) = std::mem::take(&mut index.replaced)
        .into_iter()
        .partition(|input| {
            let name = input
                .path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            kept_inputs
                .iter()
                .any(|(t, d, n)| *t == input.table && *d == input.day && n == name)
        });
    index.replaced = replaced;
    for input in kept {
        index
            .live
            .entry((input.table.clone(), input.day))
            .or_default()
            .push(input);
    }
    damaged
}

/// Finishes, at open, the merges that a kill interrupted (see
/// [`Store::finish_merge`]): deletes the files that a merged file replaces
/// (`replaced`), fsyncs their directories, then publishes each merged file
/// still under its pending name in `live`. The inputs go first, so that no
/// instant, however the next kill falls, has a published file beside one it
/// replaces. A pending file is whole (it takes that name only once written
/// and fsynced), so the merge goes forward whether or not any input was
/// deleted.
pub(super) fn finish_interrupted_merges(
    data_dir: &Path,
    replaced: &[FileInfo],
    live: &mut BTreeMap<(String, i64), Vec<FileInfo>>,
) -> Result<()> {
    let mut dirs = std::collections::BTreeSet::new();
    for info in replaced {
        remove_if_there(&info.path, "remove compacted input")?;
        dirs.extend(info.path.parent().map(Path::to_path_buf));
    }
    for dir in &dirs {
        wal::sync_dir(dir)?;
    }
    for info in live.values_mut().flatten() {
        if info.is_pending() {
            let published = files::publish_pending(data_dir, &info.path)?;
            tracing::info!(path = %published.display(), "Finished a merge that a kill interrupted: its inputs are deleted and its file published.");
            info.path = published;
        }
    }
    Ok(())
}

/// The default of [`StoreOptions::max_merge_inputs`]. Planning a merge holds the
/// sort-key columns of every input open at once, a ZSTD context and a page
/// each; a day's 24 hours merge in two rounds (24 to 3 to 1) instead of one.
pub(super) const DEFAULT_MAX_MERGE_INPUTS: usize = 8;

/// `files` in time order, cut into groups of at most `max_inputs` (2 or more)
/// neighbours; a group of one has nothing to merge with this round.
///
/// With `write_order`, in the order their rows were written (the highest WAL
/// frame each holds) instead: a merge that keeps one row per series and
/// instant keeps the first input's, and so the first written (what the
/// store held before an import, not the import's repeat of it). Groups of
/// neighbours in that order merge into files that stay in that order for
/// the next round.
pub(super) fn merge_groups(
    files: &[FileInfo],
    max_inputs: usize,
    write_order: bool,
) -> Vec<Vec<FileInfo>> {
    let mut sorted = files.to_vec();
    if write_order {
        sorted.sort_by_key(|f| (f.watermarks.values().max().copied(), f.path.clone()));
    } else {
        sorted.sort_by_key(|f| (f.time_range_us.map(|r| r.0), f.path.clone()));
    }
    sorted
        .chunks(max_inputs.max(2))
        .filter(|group| group.len() > 1)
        .map(<[FileInfo]>::to_vec)
        .collect()
}

/// Files merged together in one tier of the running hour.
pub(super) const TIER_FILES: usize = 4;

/// `TIER_FILES` files whose row counts lie within a factor of two, smallest first.
pub(super) fn similar_sized(parts: &[FileInfo]) -> Option<Vec<FileInfo>> {
    let mut by_rows: Vec<&FileInfo> = parts.iter().collect();
    by_rows.sort_by_key(|f| f.rows);
    by_rows
        .windows(TIER_FILES)
        .find(|w| w[TIER_FILES - 1].rows <= 2 * w[0].rows.max(1))
        .map(|w| w.iter().map(|f| (*f).clone()).collect())
}

impl Store {
    /// Merges files: the parts of each finished hour into one file (so a read of
    /// a past hour opens one file), and each finished day's files into one. Finished
    /// means over for longer than the publish grace with nothing of it still
    /// buffered. Safe to kill at any instant (see the crate docs). Returns the
    /// number of merges. The agent runs the same merges off its main thread
    /// ([`crate::Compactor`]); this runs them here, one after another.
    pub fn compact(&mut self, now_us: i64) -> Result<usize> {
        self.compact_with(now_us, None)
    }

    /// [`Self::compact`], and for `table` the parts of each running hour into
    /// one file too, not only those of like size, keeping one row per series
    /// and instant, the first written: for `vtax import`, which wrote
    /// everything it will write into `scraped`, and whose rows written again
    /// (an import run again after a kill) must come back once. Every other
    /// table's merges keep every row, as the agent's do: two of the agent's
    /// rows with one key (a clock stepped back) are both its evidence.
    pub fn compact_all(&mut self, now_us: i64, table: &str) -> Result<usize> {
        self.compact_with(now_us, Some(table))
    }

    /// `import_table`: an import's pass over that table, which merges every
    /// running hour's parts into one and keeps one row per series and
    /// instant.
    pub(super) fn compact_with(
        &mut self,
        now_us: i64,
        import_table: Option<&str>,
    ) -> Result<usize> {
        // A merge's output can complete a tier with others: repeat while merging.
        let mut total = 0;
        let keep_going = AtomicBool::new(true);
        // A merge that met a damaged input (quarantined by finish_merge)
        // stops no other: the rest are merged, and the first such error is
        // returned at the end. Any other error (a full disk) ends the pass.
        let mut damaged: Option<Error> = None;
        for _ in 0..MAX_MERGE_ROUNDS {
            let merges = self.plan_merges_with(now_us, import_table)?;
            if merges.is_empty() {
                break;
            }
            for merge in merges {
                let outcome = merge.run(&keep_going);
                match self.finish_merge(outcome) {
                    Ok(()) => total += 1,
                    Err(e) if e.damaged_file().is_some() => {
                        damaged.get_or_insert(e);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        match damaged {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    /// The merges due at `now_us` (one round of [`Self::compact`]), to run on
    /// any thread with [`Merge::run`] and hand back to [`Self::finish_merge`].
    /// Until then the store keeps listing, scanning and keeping their inputs;
    /// appending and publishing go on meanwhile. Plan the next round only once
    /// every merge of this one is finished: two merges of one input would
    /// each replace it.
    pub fn plan_merges(&mut self, now_us: i64) -> Result<Vec<Merge>> {
        self.plan_merges_with(now_us, None)
    }

    pub(super) fn plan_merges_with(
        &mut self,
        now_us: i64,
        import_table: Option<&str>,
    ) -> Result<Vec<Merge>> {
        self.clock_us = Some(now_us);
        let grace_us = self.options.publish_grace.as_micros() as i64;
        let buffered = |table: &str, hours: std::ops::Range<i64>| {
            self.buckets
                .keys()
                .any(|(t, h)| *t == table && hours.contains(h))
        };
        // (partition, inputs, whether the output is a part of the running hour)
        let mut groups: Vec<((String, i64), Vec<FileInfo>, bool)> = Vec::new();
        for ((table, day), files) in &self.files {
            let for_import = import_table == Some(table.as_str());
            // A merged file left pending by a failed commit holds rows of
            // inputs still on disk: its partition waits for the next open,
            // which finishes the commit, lest a merge of it bring them back.
            if files.len() < 2 || files.iter().any(FileInfo::is_pending) {
                continue;
            }
            let day_hours = day * 24..(day + 1) * 24;
            if (day + 1) * DAY_US + grace_us <= now_us && !buffered(table, day_hours) {
                for group in merge_groups(files, self.options.max_merge_inputs, for_import) {
                    groups.push(((table.clone(), *day), group, false));
                }
                continue;
            }
            let mut by_hour: BTreeMap<i64, Vec<FileInfo>> = BTreeMap::new();
            for f in files.iter().filter(|f| f.watermarks.len() == 1) {
                let hour = *f.watermarks.keys().next().expect("one hour");
                by_hour.entry(hour).or_default().push(f.clone());
            }
            for (hour, parts) in by_hour {
                if parts.len() < 2 {
                    continue;
                }
                if self.hour_over(hour, now_us) && !buffered(table, hour..hour + 1) {
                    for group in merge_groups(&parts, self.options.max_merge_inputs, for_import) {
                        groups.push(((table.clone(), *day), group, false));
                    }
                } else if for_import {
                    for group in merge_groups(&parts, self.options.max_merge_inputs, true) {
                        groups.push(((table.clone(), *day), group, true));
                    }
                } else if let Some(tier) = similar_sized(&parts) {
                    // The running hour: merge parts of like size, so an hour holds a
                    // handful of files at any time, each row rewritten a few times.
                    groups.push(((table.clone(), *day), tier, true));
                }
            }
        }
        // Names that files of a partition list as replaced are never reused: a
        // reader would take the new file for a replaced one. Nor are the names
        // of this round's inputs, which a merge before it may have replaced.
        let mut replaced: HashMap<(String, i64), Arc<HashSet<String>>> = HashMap::new();
        for (key, _, _) in &groups {
            replaced.entry(key.clone()).or_insert_with(|| {
                let listed = self.files.get(key).into_iter().flatten();
                let names = listed
                    .clone()
                    .flat_map(|f| f.compacted_from.iter().cloned())
                    .chain(listed.map(|f| f.name().to_string()))
                    .collect();
                Arc::new(names)
            });
        }
        groups
            .into_iter()
            .map(|(key, inputs, running)| {
                let replaced = replaced[&key].clone();
                let dedupe = import_table == Some(key.0.as_str());
                self.plan_merge(key, inputs, running, replaced, dedupe)
            })
            .collect()
    }

    pub(super) fn plan_merge(
        &self,
        partition: (String, i64),
        mut inputs: Vec<FileInfo>,
        running: bool,
        replaced: Arc<HashSet<String>>,
        dedupe: bool,
    ) -> Result<Merge> {
        // In the order their rows were written: of equal keys the merge
        // writes (or, deduplicating, keeps) the earlier input's first, so
        // every merged file holds a series' repeats in the order they were
        // written, and a later merge that keeps one keeps the first written
        // (a killed import's repeats merged by the agent beside the values
        // the store held before it).
        inputs.sort_by_key(|f| (f.watermarks.values().max().copied(), f.path.clone()));
        let table = self
            .catalog
            .get(&partition.0)
            .ok_or_else(|| Error::Schema(format!("no declaration for table {}", partition.0)))?;
        let mut watermarks = BTreeMap::new();
        let mut names = Vec::new();
        let mut intermediates = Vec::new();
        for info in &inputs {
            for (&hour, &seq) in &info.watermarks {
                let w = watermarks.entry(hour).or_insert(0);
                *w = seq.max(*w);
            }
            names.push(info.name().to_string());
            // A multi-hour input is a day merged in rounds (or a merged day
            // that a late row reopens): name what it merged too, so that an
            // uploader that put or covered those hours sees its rows are here.
            // Hour files stop the expansion: they are what gets uploaded.
            if info.watermarks.len() > 1 && !info.compacted_from.is_empty() {
                intermediates.push(info.name().to_string());
                names.extend(info.compacted_from.iter().cloned());
                intermediates.extend(info.compacted_intermediates.iter().cloned());
            }
        }
        names.sort();
        names.dedup();
        intermediates.sort();
        intermediates.dedup();
        let first_time = inputs
            .iter()
            .filter_map(|f| f.time_range_us.map(|r| r.0))
            .min()
            .unwrap_or(partition.1 * DAY_US);
        Ok(Merge {
            data_dir: self.options.data_dir.clone(),
            node: self.options.node.clone(),
            options: self.write_options(running).into_owned(),
            partition,
            table,
            inputs,
            first_time,
            watermarks,
            names,
            intermediates,
            replaced,
            dedupe,
            kill_step: self.merge_kill_step,
        })
    }

    /// Takes a merge's outcome and commits it: its output, written under its
    /// pending name ([`files::pending_name`]), replaces its inputs in the
    /// store's list; the inputs are deleted and the directory fsynced; then
    /// the output is renamed to its published name and the directory fsynced.
    /// A glob of `*.parquet` thus reads the inputs until the first is
    /// deleted, fewer of them until the output is published (the rows of the
    /// deleted ones are missing, never doubled), then the output alone. The
    /// store's readers read the output from the moment it is there, pending
    /// or not, and never its inputs beside it; [`Self::open`] finishes a
    /// commit that a kill interrupted. A merge that failed or was stopped
    /// changes nothing; its inputs are merged at a later round. Returns the
    /// merge's error, counted as a write error unless the merge was stopped.
    pub fn finish_merge(&mut self, outcome: MergeOutcome) -> Result<()> {
        let MergeOutcome {
            merge,
            output,
            repeated_rows,
            writing,
        } = outcome;
        let info = match output {
            Ok(info) => info,
            Err(e) => {
                let damaged = e
                    .damaged_file()
                    .and_then(|p| merge.inputs.iter().find(|i| i.path == p));
                if let Some(damaged) = damaged {
                    // Left in place it would fail this merge at every pass, and
                    // the rest of its day would never be merged.
                    self.quarantine_published(&merge.partition, &damaged.path)?;
                    tracing::error!(path = %damaged.path.display(), error = %e, "Moved a file that a merge could not read to quarantine.");
                } else if writing && !matches!(e, Error::Stopped) {
                    self.count_error(&e);
                }
                return Err(e);
            }
        };
        self.stats.files_published += 1;
        if repeated_rows > 0 {
            *self
                .stats
                .rows_repeated
                .entry(merge.table.name)
                .or_default() += repeated_rows;
        }
        self.stats.last_file_written = Some(SystemTime::now());
        let pending = info.path.clone();
        let partition = self.files.entry(merge.partition.clone()).or_default();
        partition.retain(|f| !merge.inputs.iter().any(|i| i.path == f.path));
        partition.push(info);
        match self.commit_merge(&merge, &pending) {
            Ok(published) => {
                if let Some(info) = self
                    .files
                    .get_mut(&merge.partition)
                    .and_then(|files| files.iter_mut().find(|f| f.path == pending))
                {
                    info.path = published;
                }
                Ok(())
            }
            Err(e) => {
                // The output stays listed under its pending name: it holds
                // the rows of the inputs, deleted or not, and the next open
                // finishes the commit.
                self.count_error(&e);
                Err(e)
            }
        }
    }

    /// Deletes a merge's inputs, fsyncs their directory, and publishes its
    /// output, written to `pending`: the steps of [`Self::finish_merge`]
    /// after the output is in place. Returns the output's published path.
    pub(super) fn commit_merge(&self, merge: &Merge, pending: &Path) -> Result<PathBuf> {
        for (deleted, input) in merge.inputs.iter().enumerate() {
            kill_point(self.merge_kill_step, 1 + deleted);
            remove_if_there(&input.path, "remove compacted input")?;
        }
        if let Some(dir) = pending.parent() {
            wal::sync_dir(dir)?;
        }
        kill_point(self.merge_kill_step, 1 + merge.inputs.len());
        files::publish_pending(&self.options.data_dir, pending)
    }

    /// Moves a published file of `partition` to `quarantine/` and out of the
    /// store's list.
    pub(super) fn quarantine_published(
        &mut self,
        partition: &(String, i64),
        path: &Path,
    ) -> Result<()> {
        quarantine(&self.options.data_dir, path)?;
        if let Some(files) = self.files.get_mut(partition) {
            files.retain(|f| f.path != path);
        }
        self.stats.files_quarantined += 1;
        Ok(())
    }

    /// Reads every page of every published file ([`files::verify_file`]) and
    /// moves each that is damaged to `quarantine/`. Returns the files moved,
    /// with what was wrong. An error that is not a file's damage (a failed
    /// read of the disk) is returned and nothing is moved.
    pub fn quarantine_damaged(&mut self) -> Result<Vec<(PathBuf, Error)>> {
        let mut damaged = Vec::new();
        for (partition, files) in &self.files {
            for info in files {
                if let Err(e) = files::verify_file(info) {
                    if e.damaged_file().is_none() {
                        return Err(e);
                    }
                    damaged.push((partition.clone(), info.path.clone(), e));
                }
            }
        }
        let mut moved = Vec::new();
        for (partition, path, e) in damaged {
            self.quarantine_published(&partition, &path)?;
            tracing::error!(path = %path.display(), error = %e, "Moved a damaged file to quarantine.");
            moved.push((path, e));
        }
        Ok(moved)
    }

    /// Deletes whole files older than the age limit, then, while the tables
    /// exceed the byte budget, the oldest files of any table first (by the
    /// first row they hold): skipping those that
    /// [`StoreOptions::retention_deletable`] keeps. Returns the files deleted.
    ///
    /// The budget takes the store's oldest rows whichever table holds them:
    /// taken a partition at a time in table-name order, it emptied `block`
    /// of every file, its newest included, before touching an older file of
    /// `cpu`, and a store at its budget held minutes of some tables and hours
    /// of others.
    pub fn apply_retention(&mut self, now_us: i64) -> Result<usize> {
        let mut removed = 0;
        let mut total = self.table_bytes();
        let deletable = |options: &StoreOptions, info: &FileInfo| {
            options
                .retention_deletable
                .as_ref()
                .is_none_or(|d| (d.0)(info))
        };
        let mut touched: std::collections::BTreeSet<(String, i64)> = Default::default();
        // A file that will not go (its permissions, an immutable flag) stays
        // listed and the rest go on: stopping at it kept every expired day
        // after it, and dropped its partition's other files from the index.
        let mut failed: Option<Error> = None;
        let mut remove = |path: &Path| match fs::remove_file(path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => {
                failed.get_or_insert(Error::io("remove expired file", path)(e));
                false
            }
        };
        if let Some(age) = self.options.retention_max_age {
            let cutoff = now_us - age.as_micros() as i64;
            for ((table, day), partition) in &mut self.files {
                if (day + 1) * DAY_US > cutoff {
                    continue;
                }
                let mut kept = Vec::with_capacity(partition.len());
                for info in partition.drain(..) {
                    if deletable(&self.options, &info) && remove(&info.path) {
                        total -= info.bytes;
                        removed += 1;
                        touched.insert((table.clone(), *day));
                    } else {
                        kept.push(info);
                    }
                }
                *partition = kept;
            }
        }
        if let Some(max) = self.options.retention_max_bytes {
            // Every file, oldest first: its first row's time, else its day's start.
            let mut oldest: Vec<(i64, String, i64, PathBuf)> = self
                .files
                .iter()
                .flat_map(|((table, day), partition)| {
                    partition.iter().map(move |info| {
                        let first = info.time_range_us.map_or(day * DAY_US, |r| r.0);
                        (first, table.clone(), *day, info.path.clone())
                    })
                })
                .collect();
            oldest.sort();
            for (_, table, day, path) in oldest {
                if total <= max {
                    break;
                }
                let partition = self
                    .files
                    .get_mut(&(table.clone(), day))
                    .expect("listed from the files");
                let at = partition
                    .iter()
                    .position(|f| f.path == path)
                    .expect("listed from the partition");
                if !deletable(&self.options, &partition[at]) || !remove(&partition[at].path) {
                    continue;
                }
                let info = partition.remove(at);
                total -= info.bytes;
                removed += 1;
                touched.insert((table, day));
            }
        }
        for (table, day) in touched {
            let dir = files::partition_dir(&self.options.data_dir, &table, day);
            if self
                .files
                .get(&(table.clone(), day))
                .is_some_and(Vec::is_empty)
            {
                self.files.remove(&(table, day));
                let _ = fs::remove_dir(&dir);
            }
            if dir.exists() {
                wal::sync_dir(&dir)?;
            }
        }
        self.stats.files_retained_away += removed as u64;
        match failed {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }
}
