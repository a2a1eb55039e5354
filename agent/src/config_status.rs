//! Whether the configuration file's last reload was taken, as Prometheus
//! gives its own (`prometheus_config_last_reload_successful`): a refused
//! reload was one log line, and a fleet whose nodes run an old configuration
//! after a rollout was no query.

use vtax_store::{Batch, BatchBuilder};

use crate::collectors::runtime_tables::{ConfigRow, CONFIG};
use crate::config::Config;

/// The state the `config` table's row shows.
pub struct ConfigStatus {
    last_reload_successful: bool,
    success_us: i64,
    restart_pending: bool,
}

impl ConfigStatus {
    /// The agent started with its configuration at `time_us`.
    pub fn started(time_us: i64) -> Self {
        ConfigStatus {
            last_reload_successful: true,
            success_us: time_us,
            restart_pending: false,
        }
    }

    /// A reload was refused: the running configuration stays.
    pub fn refused(&mut self) {
        self.last_reload_successful = false;
    }

    /// A reload was taken at `time_us`; `restart_pending` says whether the
    /// file asks for what only a restart changes.
    pub fn taken(&mut self, time_us: i64, restart_pending: bool) {
        self.last_reload_successful = true;
        self.success_us = time_us;
        self.restart_pending = restart_pending;
    }

    /// The row at `time_us`.
    pub fn row(&self, time_us: i64) -> Batch {
        let row = ConfigRow {
            last_reload_successful: i64::from(self.last_reload_successful),
            last_reload_success_timestamp_seconds: self.success_us as f64 / 1e6,
            restart_pending: i64::from(self.restart_pending),
        };
        let mut rows = BatchBuilder::new(&CONFIG);
        rows.push_row(time_us, &row)
            .expect("a config row is for the config table");
        rows.finish()
    }
}

/// What a reload takes of `new`: everything but the sections read only at
/// the start (`[web]`, `[store]`, `[[remote_write]]`, `[upload]`), which stay
/// as `running` has them, since the listener, the store and the senders
/// opened with them still run; and whether `new` differs there. Taking them
/// too made the running configuration claim what was not in effect, and the
/// next reload no longer said that a restart was due.
pub fn take_reload(running: &Config, new: Config) -> (Config, bool) {
    let restart_pending = new.web != running.web
        || new.store != running.store
        || new.remote_write != running.remote_write
        || new.upload != running.upload;
    let taken = Config {
        web: running.web.clone(),
        store: running.store.clone(),
        remote_write: running.remote_write.clone(),
        upload: running.upload.clone(),
        ..new
    };
    (taken, restart_pending)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vtax_exporters::{Exposition, Format};

    use super::*;

    #[test]
    fn a_restart_only_change_stays_pending_through_later_reloads() {
        let running = Config::default();
        let mut file = Config::default();
        file.web.listen_address = ":9999".into();
        file.collectors.host.interval_secs = 5.0;
        let (taken, pending) = take_reload(&running, file.clone());
        assert!(pending);
        assert_eq!(
            taken.web, running.web,
            "the listener runs on the old address"
        );
        assert_eq!(
            taken.collectors.host.interval_secs, 5.0,
            "collectors reload"
        );
        // The same file again: the address still differs from the running one.
        let (again, pending) = take_reload(&taken, file);
        assert!(pending);
        assert_eq!(again.web, running.web);
        // The file goes back to the running address: nothing is due.
        let (_, pending) = take_reload(&again, Config::default());
        assert!(!pending);
    }

    #[test]
    fn metrics_say_refused_until_a_reload_is_taken() {
        let mut status = ConfigStatus::started(1_000_000);
        let metrics = |status: &ConfigStatus| {
            // A body is rendered once without the renderer thread.
            let exposition = Exposition::new(&[&CONFIG]);
            exposition.update("config", vec![Arc::new(status.row(5_000_000))]);
            let body = exposition.body(Format::Text, false);
            let body = String::from_utf8(body.to_vec()).unwrap();
            assert_eq!(crate::golden::promtool_complaints(&body), "");
            let value = |name: &str| {
                body.lines()
                    .find_map(|l| l.strip_prefix(&format!("vtax_config_{name} ")))
                    .unwrap_or_else(|| panic!("no vtax_config_{name} in {body}"))
                    .to_string()
            };
            [
                value("last_reload_successful"),
                value("last_reload_success_timestamp_seconds"),
                value("restart_pending"),
            ]
        };
        assert_eq!(metrics(&status), ["1", "1", "0"]);
        status.refused();
        assert_eq!(metrics(&status), ["0", "1", "0"]);
        status.taken(3_000_000, true);
        assert_eq!(metrics(&status), ["1", "3", "1"]);
    }
}
