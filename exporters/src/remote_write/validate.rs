//! Checking a `[[remote_write]]` table: its values, then whether a client
//! can be built from it (the URL parses, the TLS files load), before the
//! agent starts rather than at the first send.

use super::config::{RemoteWriteConfig, MIN_QUEUE_MAX_BYTES};

/// The longest remote name.
const MAX_NAME_BYTES: usize = 64;

impl RemoteWriteConfig {
    /// Checks what the types cannot; on failure the key (relative to the
    /// table) and the message.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        // It names the queue's directory: within a file name's 255 bytes,
        // with room for what a person reads.
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_NAME_BYTES
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err((
                "name",
                format!(
                    "remote_write name {:?}: use at most {MAX_NAME_BYTES} letters, digits, _ and - (it names a directory)",
                    self.name
                ),
            ));
        }
        for name in self.external_labels.keys() {
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with("__");
            if !valid {
                return Err((
                    "external_labels",
                    format!(
                        "remote_write {}: external label {name:?} is not a Prometheus label name",
                        self.name
                    ),
                ));
            }
        }
        super::send::Client::new(self).map_err(|e| {
            let key = if e.starts_with("url") { "url" } else { "tls" };
            (key, format!("remote_write {}: {e}", self.name))
        })?;
        if let Some(auth) = &self.basic_auth {
            if auth.password.is_some() && auth.password_file.is_some() {
                return Err((
                    "basic_auth",
                    format!(
                        "remote_write {}: basic_auth takes password or password_file, not both",
                        self.name
                    ),
                ));
            }
        }
        let empty = match (&self.basic_auth, &self.bearer_token) {
            (Some(auth), _) if auth.username.is_empty() => Some("basic_auth"),
            (_, Some(token)) if token.is_empty() => Some("bearer_token"),
            _ => None,
        };
        if let Some(key) = empty {
            return Err((
                key,
                format!(
                    "remote_write {}: {key} is empty: give the credential, or leave the key out",
                    self.name
                ),
            ));
        }
        if self.tls.is_some() && self.url.starts_with("http://") {
            return Err((
                "tls",
                format!(
                    "remote_write {}: a [tls] table on an http:// url is never used: make the url https://, or leave tls out",
                    self.name
                ),
            ));
        }
        let credentials = usize::from(self.basic_auth.is_some())
            + usize::from(self.bearer_token.is_some())
            + usize::from(self.bearer_token_file.is_some());
        if credentials > 1 {
            let key = if self.bearer_token_file.is_some() {
                "bearer_token_file"
            } else {
                "bearer_token"
            };
            return Err((
                key,
                format!(
                    "remote_write {}: set one of basic_auth, bearer_token and bearer_token_file",
                    self.name
                ),
            ));
        }
        if self.tables.as_ref().is_some_and(Vec::is_empty) {
            return Err((
                "tables",
                format!(
                    "remote_write {}: tables = [] sends nothing; leave it unset to send every table",
                    self.name
                ),
            ));
        }
        if self.queue_max_bytes < MIN_QUEUE_MAX_BYTES {
            return Err((
                "queue_max_bytes",
                format!(
                    "remote_write {}: queue_max_bytes = {} is below the least, {MIN_QUEUE_MAX_BYTES}",
                    self.name, self.queue_max_bytes
                ),
            ));
        }
        if self.max_samples_per_send == 0 || self.max_samples_per_send > 1_000_000 {
            return Err((
                "max_samples_per_send",
                format!(
                    "remote_write {}: max_samples_per_send = {}: must be between 1 and 1000000",
                    self.name, self.max_samples_per_send
                ),
            ));
        }
        for (key, secs) in [
            ("batch_send_deadline_secs", self.batch_send_deadline_secs),
            ("min_backoff_secs", self.min_backoff_secs),
            ("max_backoff_secs", self.max_backoff_secs),
            ("remote_timeout_secs", self.remote_timeout_secs),
        ] {
            if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
                return Err((
                    key,
                    format!(
                        "remote_write {}: {key} = {secs}: must be above 0 and at most 3600",
                        self.name
                    ),
                ));
            }
        }
        if self.min_backoff_secs > self.max_backoff_secs {
            return Err((
                "min_backoff_secs",
                format!(
                    "remote_write {}: min_backoff_secs is above max_backoff_secs",
                    self.name
                ),
            ));
        }
        Ok(())
    }
}
