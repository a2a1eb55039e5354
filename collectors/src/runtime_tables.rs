//! Tables the runtime writes about itself: how each collector fared, how
//! the store and the uploader are doing, and how remote write is keeping up.

use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};

const COLLECTOR_TAG: TagDef = TagDef {
    name: "collector",
    help: "Collector name, as in `[collectors.<name>]`.",
};

vtax_store::table! {
    /// One row per collector run.
    pub static COLLECTOR: TableDef, pub struct CollectorRow {
        name: "collector",
        help: "One row per collector run: how long it took and whether it succeeded.",
        tags: [collector = COLLECTOR_TAG],
        fields: [
            duration_seconds: f64 = FieldDef::gauge(FieldType::F64, Unit::Seconds, "Wall-clock time the collector's last run took."),
            success: i64 = FieldDef::gauge(FieldType::I64, Unit::None, "1 if the collector's last run succeeded, 0 if it failed or its source reads badly since the start (probed again until it mends). A run that read some of its sources succeeded: see failed_sources."),
            failed_sources: u64 = FieldDef::gauge(FieldType::U64, Unit::None, "Sources (files, devices) that read badly in the collector's last run while it read the others: their rows or fields are left out. The log and vtax doctor name them."),
            left_out: u64 = FieldDef::gauge(FieldType::U64, Unit::None, "What the source has that the collector's last run left out: cgroups over collectors.cgroups.max_cgroups or whose names are not UTF-8 (a label must be), cgroups perf cannot count within collectors.perf.max_counters, mounts over collectors.filesystem.max_mounts. Their series are missing; vtax doctor says why. Raise the cap, or narrow what the collector selects."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// One row per pass of the uploader (`agent/src/upload/`).
    pub static UPLOAD: TableDef, pub struct UploadRow {
        name: "upload",
        help: "One row per pass of the uploader that copies sealed Parquet files to object storage.",
        tags: [],
        fields: [
            files: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Files uploaded and confirmed (size and ETag checked) since the agent started."),
            file_bytes: u64 = FieldDef::counter(FieldType::U64, Unit::Bytes, "Bytes of the files uploaded since the agent started."),
            covered_files: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Merged files recorded as uploaded without a put, since every file they merge is remote."),
            replaced_objects_deleted: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Remote objects deleted because an uploaded file that merges them replaced them."),
            failures: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Failed puts, checks and deletes since the agent started; each is retried at the next pass."),
            pending_files: u64 = FieldDef::gauge(FieldType::U64, Unit::None, "Files of finished hours not yet uploaded after the last pass: after a failed upload, parts of an hour the running store has yet to merge, or files that do not read or whose bytes changed since they were written (damage; `vtax verify` names it). Files of hours not yet ended are not counted."),
            oldest_pending_age_seconds: f64 = FieldDef::gauge(FieldType::F64, Unit::Seconds, "Seconds since the oldest file not yet uploaded was written; 0 when none waits."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// One row a second from the main loop (the agent's `store_report`): the
    /// store's size against its budget and the disk, and its counters since
    /// the agent started.
    pub static STORE: TableDef, pub struct StoreRow {
        name: "store",
        help: "One row a second: the local store's size on disk against its byte budget and its filesystem, and what it wrote, refused and failed to write since the agent started.",
        tags: [],
        fields: [
            table_bytes: u64 = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Bytes of the Parquet files of every table: what store.retention_max_bytes bounds."),
            table_files: u64 = FieldDef::gauge(FieldType::U64, Unit::None, "Parquet files of every table."),
            wal_bytes: u64 = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Bytes of the write-ahead log's segments on disk: rows not yet in a Parquet file."),
            retention_max_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "store.retention_max_bytes: past it, retention deletes the oldest files. Absent when there is no byte budget (0)."),
            filesystem_avail_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Bytes an unprivileged user may still write on the data directory's filesystem (statvfs f_bavail). Absent while statvfs fails."),
            filesystem_size_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Size of the data directory's filesystem. Absent while statvfs fails."),
            rows_appended: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Rows the store took since the agent started."),
            rows_refused: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Rows the store refused since the agent started, lost: after failed writes it holds rows in memory up to a bound, then refuses more."),
            dropped_batches: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Batches of rows dropped since the agent started because the queue from the collectors to the main thread was full: the main thread fell behind (a slow disk). Lost: neither stored nor shown to the detector."),
            write_errors: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Failed writes of the WAL or of a Parquet file since the agent started; the rows stay held and are retried."),
            disk_full_errors: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Failed writes that were the disk being full (ENOSPC, EDQUOT) since the agent started."),
            files_written: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Parquet files written since the agent started: publishes and merges."),
            files_quarantined: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Store files put in quarantine/ since the agent started: Parquet files that failed verification at open or in a merge (moved), and damaged WAL segments (copied)."),
            files_deleted_by_retention: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Files retention deleted, by age or byte budget, since the agent started."),
            wal_syncs: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Completed fsyncs of the write-ahead log since the agent started."),
            last_file_written_time_seconds: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::Seconds, "Unix time at which the last Parquet file was written. Absent until the first since the agent started."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// One row when the agent starts and every minute while it runs (the
    /// agent's `build_info`): `vtax_build_info`, as Prometheus exporters give
    /// their build.
    pub static BUILD: TableDef, pub struct BuildRow {
        name: "build",
        help: "One row when the agent starts and one a minute while it runs: the build it runs as tags, and 1. Served on /metrics for as long as it runs and sent to remote-write receivers every minute (within Prometheus's 5-minute look-back), so a fleet's versions are one query.",
        tags: [
            version = TagDef {
                name: "version",
                help: "The agent's version (Cargo.toml).",
            },
            revision = TagDef {
                name: "revision",
                help: "The git commit it was built from (12 hex digits; only release builds ask git), VTAX_BUILD_REVISION from the build's environment when set, or `unknown`.",
            },
            rustc_version = TagDef {
                name: "rustc_version",
                help: "Version of the rustc that built it.",
            },
        ],
        fields: [info: i64 = FieldDef::gauge(FieldType::I64, Unit::None, "Always 1: the build is in the labels.")],
        exported: true,
    }
}

vtax_store::table! {
    /// The configuration in effect (`agent/src/config_status.rs`).
    pub static CONFIG: TableDef, pub struct ConfigRow {
        name: "config",
        help: "One row when the agent starts, at each reload (SIGHUP) and one a minute while it runs: whether the configuration file's last reload was taken, as Prometheus gives its own.",
        tags: [],
        fields: [
            last_reload_successful: i64 = FieldDef::gauge(FieldType::I64, Unit::None, "1 if the last reload of the configuration file was taken (or none was asked since the start), 0 if it was refused: the file does not validate and the running configuration stays. The log says why; vtax check-config names the key."),
            last_reload_success_timestamp_seconds: f64 = FieldDef::gauge(FieldType::F64, Unit::Seconds, "When the configuration in effect was taken: the agent's start, or the last reload taken (Unix seconds)."),
            restart_pending: i64 = FieldDef::gauge(FieldType::I64, Unit::None, "1 if the file taken at the last reload changes [web], [store], [[remote_write]] or [upload], which are read only at the start: those changes take effect at the next restart."),
        ],
        exported: true,
    }
}

/// Tables of this module; `remote_write` is declared beside the code that
/// fills it.
pub static TABLES: &[&TableDef] = &[
    &COLLECTOR,
    &UPLOAD,
    &STORE,
    &vtax_exporters::remote_write::TABLE,
    &BUILD,
    &CONFIG,
];
