//! The `/metrics` HTTP server, with TLS and basic auth configured by a file in
//! the Prometheus exporters' web config format (`--web.config.file`), so
//! operators reuse the files and bcrypt hashes they already have:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt        # relative paths: from the config file's directory
//!   key_file: server.key
//!   client_ca_file: ca.crt       # optional, with client_auth_type
//!   client_auth_type: RequireAndVerifyClientCert
//!   min_version: TLS12           # or TLS13; max_version too
//!   cipher_suites: [...]         # TLS 1.2 suites by IANA name; curve_preferences
//! http_server_config:
//!   headers:                     # security headers sent with every answer
//!     Strict-Transport-Security: max-age=31536000
//! basic_auth_users:
//!   prometheus: $2y$10$...        # bcrypt hash (htpasswd -nBC 10)
//! ```
//!
//! The file is read again when it changes (checked at each request), so
//! rotated certificates and users need no restart: users and headers apply
//! from the next request, kept-alive connections included, certificates from
//! the next connection. A changed file that does not load is logged and the
//! previous one stays in force.
//!
//! Clients get bounded shares of the server ([`WebLimits`]): a cap on open
//! connections (when full, the one that has waited longest for a request
//! makes room for a new one), a bounded request head, timeouts on the TLS
//! handshake, on each request head (the wait for the next request on a
//! kept-alive connection included) and on any transfer that stalls, and one
//! bcrypt verification at a time, run off the threads that serve scrapes. A
//! credential verified once, or refused once, is answered from a cache, so
//! wrong passwords arriving in bulk cost scrapers with a good one nothing but
//! their share of the two serving threads; new credentials wait their turn
//! for the verification slot, a 503 only after 5 s. An unknown user is
//! verified against a real user's hash, so that it costs what a known one
//! does and user names cannot be told apart by timing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use vtax_store::schema::{FieldDef, FieldType, Unit};
use vtax_store::{Batch, BatchBuilder};

use crate::exposition::{Exposition, Format};

mod config;
mod server;

pub use config::*;
pub use server::*;

#[cfg(test)]
mod tests;

vtax_store::table! {
    /// The server's own counters, one row a second (published by the agent's
    /// main loop from [`WebServer::stats`]).
    pub static TABLE: TableDef, pub struct WebRow {
        name: "web",
        help: "One row a second: what the /metrics server holds and what it refused since the agent started.",
        tags: [],
        fields: [
            connections_open: u64 = FieldDef::gauge(FieldType::U64, Unit::None, "Connections open now, TLS handshakes included; at most max connections (128)."),
            connections_refused: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Connections closed as soon as accepted because max connections (128) were already open, each writing an answer, since the agent started."),
            connections_evicted: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Connections closed to make room for a new one when max connections (128) were open: of those not writing an answer (idle, sending a request head, or waiting for credentials to be verified), the one whose last request began longest ago, since the agent started."),
            connections_timed_out: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Connections closed because a TLS handshake (10 s), a request head (30 s, the wait for the next request on a kept-alive connection included) or a stalled transfer (30 s without a byte) ran past its timeout, since the agent started."),
            auth_failures: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Requests answered 401 under basic auth: no credentials, or a user name or password that basic_auth_users does not hold, since the agent started."),
            auth_busy: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Requests answered 503 because their credentials were not verified yet and waited 5 s in turn for the bcrypt verification slot without getting it, since the agent started."),
        ],
        exported: true,
    }
}

/// Bounds on what clients can hold of the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebLimits {
    /// A TLS handshake not done by then closes the connection.
    pub tls_handshake_timeout: Duration,
    /// A request head not wholly read by then closes the connection. The
    /// clock starts when the connection waits for a request, so it also ends
    /// kept-alive connections that stay idle this long (a scraper that
    /// scrapes less often opens a new connection per scrape).
    pub header_read_timeout: Duration,
    /// A connection on which no byte moved either way for this long is
    /// closed: a client that stops reading its response, or stops sending.
    pub idle_timeout: Duration,
    /// Connections open at once. One accepted beyond it closes the open
    /// connection that has waited longest for a request, and is closed at
    /// once only when every open one is answering a request; both counted.
    pub max_connections: usize,
}

/// Default [`WebLimits::tls_handshake_timeout`].
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`WebLimits::header_read_timeout`] (hyper's own default).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`WebLimits::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`WebLimits::max_connections`]: a node has a few scrapers.
pub const DEFAULT_MAX_CONNECTIONS: usize = 128;

impl Default for WebLimits {
    fn default() -> Self {
        WebLimits {
            tls_handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// bcrypt verifications running at once. Each takes tens of milliseconds of a
/// core by design; one at a time leaves the other core of a small node to the
/// serving threads.
const BCRYPT_SLOTS: usize = 1;

/// How long a credential not verified yet waits in turn for the bcrypt slot
/// before a 503: the queue is at most one request a connection, and a
/// scrape's timeout (10 s by default) outlasts it.
const BCRYPT_WAIT: Duration = Duration::from_secs(5);

/// How long a new connection waits for the room an evicted one makes.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// The most a connection buffers of a request head (hyper's least is 8 KiB).
const MAX_REQUEST_HEAD_BYTES: usize = 16 << 10;

/// Verified credentials kept; past it the cache starts again (each scraper
/// then pays one bcrypt). Only credentials that verified get in.
const VERIFIED_MAX: usize = 64;

/// Refused credentials kept (8 bytes each); past it the cache starts again.
const REFUSED_MAX: usize = 4096;

/// What the server holds and refused since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WebStats {
    /// Connections open now.
    pub connections_open: u64,
    /// Connections closed at once for want of a slot.
    pub connections_refused: u64,
    /// Connections closed to make room for a new one.
    pub connections_evicted: u64,
    /// Connections closed by a timeout.
    pub connections_timed_out: u64,
    /// Requests answered 401.
    pub auth_failures: u64,
    /// Requests answered 503 because the bcrypt slot was taken.
    pub auth_busy: u64,
}

impl WebStats {
    /// The row of [`TABLE`] at `time_us`.
    pub fn row(&self, time_us: i64) -> Batch {
        let row = WebRow {
            connections_open: self.connections_open,
            connections_refused: self.connections_refused,
            connections_evicted: self.connections_evicted,
            connections_timed_out: self.connections_timed_out,
            auth_failures: self.auth_failures,
            auth_busy: self.auth_busy,
        };
        let mut builder = BatchBuilder::new(&TABLE);
        builder
            .push_row(time_us, &row)
            .expect("a web row is for the web table");
        builder.finish()
    }
}

#[derive(Default)]
struct Counters {
    connections_refused: AtomicU64,
    connections_evicted: AtomicU64,
    connections_timed_out: AtomicU64,
    auth_failures: AtomicU64,
    auth_busy: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The web config in force, re-read when its file changes.
struct WebConfig {
    path: Option<PathBuf>,
    current: Mutex<(Option<SystemTime>, Arc<Loaded>)>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Checks a web config file without serving (`vtax check-config`).
pub fn check_web_config(path: &Path) -> Result<(), WebConfigError> {
    load(path).map(|_| ())
}

/// Threads serving HTTP: scrapes only copy ready bytes, so two are plenty.
const WEB_THREADS: usize = 2;

/// How often [`WebServer::publish_stats`] publishes.
const STATS_INTERVAL: Duration = Duration::from_secs(1);

/// The exposition's source name of the server's own rows.
const STATS_SOURCE: &str = "web";

const LANDING_PAGE: &str = "<html><head><title>vtax</title></head><body>\
<h1>vtax</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n";
