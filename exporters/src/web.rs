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
//!   min_version: TLS12           # or TLS13
//! basic_auth_users:
//!   prometheus: $2y$10$...        # bcrypt hash (htpasswd -nBC 10)
//! ```
//!
//! The file is read again when it changes (checked on each new connection), so
//! rotated certificates and users need no restart; a changed file that does
//! not load is logged and the previous one stays in force.
//!
//! Clients get bounded shares of the server ([`WebLimits`]): a cap on open
//! connections, timeouts on the TLS handshake, on each request head (the wait
//! for the next request on a kept-alive connection included) and on any
//! transfer that stalls, and one bcrypt verification at a time, run off the
//! threads that serve scrapes. A credential verified once is served from a
//! cache, so wrong passwords arriving in bulk cost scrapers with a good one
//! nothing but their share of the two serving threads; new credentials that
//! find the verification slot taken are answered 503 at once. An unknown user
//! is verified against a real user's hash, so that it costs what a known one
//! does and user names cannot be told apart by timing.

use std::collections::{BTreeMap, HashSet};
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

vtax_store::table! {
    /// The server's own counters, one row a second (published by the agent's
    /// main loop from [`WebServer::stats`]).
    pub static TABLE: TableDef, pub struct WebRow {
        name: "web",
        help: "One row a second: what the /metrics server holds and what it refused since the agent started.",
        tags: [],
        fields: [
            connections_open: u64 = FieldDef::gauge(FieldType::U64, Unit::None, "Connections open now, TLS handshakes included; at most max connections (128)."),
            connections_refused: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Connections closed as soon as accepted because max connections (128) were already open, since the agent started."),
            connections_timed_out: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Connections closed because a TLS handshake (10 s), a request head (30 s, the wait for the next request on a kept-alive connection included) or a stalled transfer (30 s without a byte) ran past its timeout, since the agent started."),
            auth_failures: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Requests answered 401 under basic auth: no credentials, or a user name or password that basic_auth_users does not hold, since the agent started."),
            auth_busy: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Requests answered 503 at once because their credentials were not verified yet and the bcrypt verification slot was taken, since the agent started."),
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
    /// Connections open at once; those accepted beyond it are closed at once
    /// and counted.
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
/// serving threads, and a flood of wrong passwords gets 503s, not a queue.
const BCRYPT_SLOTS: usize = 1;

/// Verified credentials kept; past it the cache starts again (each scraper
/// then pays one bcrypt). Only credentials that verified get in.
const VERIFIED_MAX: usize = 64;

/// What the server holds and refused since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WebStats {
    /// Connections open now.
    pub connections_open: u64,
    /// Connections closed at once for want of a slot.
    pub connections_refused: u64,
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
    connections_timed_out: AtomicU64,
    auth_failures: AtomicU64,
    auth_busy: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Why a web config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The YAML does not parse or has an unknown key.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A value is wrong (a bad hash, a certificate that does not load).
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebConfigFile {
    #[serde(default)]
    tls_server_config: Option<TlsServerConfig>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsServerConfig {
    cert_file: PathBuf,
    key_file: PathBuf,
    #[serde(default)]
    client_ca_file: Option<PathBuf>,
    #[serde(default)]
    client_auth_type: Option<String>,
    #[serde(default)]
    min_version: Option<String>,
}

/// A loaded web config: TLS acceptor and users.
struct Loaded {
    tls: Option<tokio_rustls::TlsAcceptor>,
    users: BTreeMap<String, String>,
    /// Credentials already verified against their bcrypt hash, as keyed hashes
    /// of the `Authorization` header: bcrypt is slow on purpose, and a scraper
    /// sends the same header every few seconds.
    verified: Mutex<HashSet<u64>>,
    hasher: std::collections::hash_map::RandomState,
    /// The hash an unknown user is verified against: the costliest user's.
    decoy: Option<String>,
}

/// Parses and loads a web config file, certificates included.
fn load(path: &Path) -> Result<Loaded, WebConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| WebConfigError::Read {
        path: name.clone(),
        source,
    })?;
    let file: WebConfigFile = if text.trim().is_empty() {
        WebConfigFile::default()
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| WebConfigError::Parse {
            path: name.clone(),
            message: e.to_string(),
        })?
    };
    let invalid = |message: String| WebConfigError::Invalid {
        path: name.clone(),
        message,
    };
    for (user, hash) in &file.basic_auth_users {
        if hash.parse::<bcrypt::HashParts>().is_err() {
            return Err(invalid(format!(
                "basic_auth_users.{user}: not a bcrypt hash (make one with `htpasswd -nBC 10 {user}`)"
            )));
        }
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let tls = match &file.tls_server_config {
        None => None,
        Some(tls) => Some(tls_acceptor(tls, base).map_err(invalid)?),
    };
    Ok(Loaded::new(tls, file.basic_auth_users))
}

fn tls_acceptor(tls: &TlsServerConfig, base: &Path) -> Result<tokio_rustls::TlsAcceptor, String> {
    use pki_types::pem::PemObject;
    use pki_types::{CertificateDer, PrivateKeyDer};
    let cert_path = base.join(&tls.cert_file);
    let key_path = base.join(&tls.key_file);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("tls_server_config.cert_file {}: {e}", cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "tls_server_config.cert_file {}: no certificate in it",
            cert_path.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .map_err(|e| format!("tls_server_config.key_file {}: {e}", key_path.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version.as_deref() {
        None | Some("TLS12") => &[&rustls::version::TLS13, &rustls::version::TLS12],
        Some("TLS13") => &[&rustls::version::TLS13],
        Some(other) => {
            return Err(format!(
                "tls_server_config.min_version {other:?}: vtax supports TLS12 and TLS13"
            ))
        }
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| format!("tls_server_config: {e}"))?;
    let builder = match (tls.client_auth_type.as_deref(), &tls.client_ca_file) {
        (None | Some("NoClientCert"), _) => builder.with_no_client_auth(),
        (Some(kind @ ("RequireAndVerifyClientCert" | "VerifyClientCertIfGiven")), Some(ca)) => {
            let ca_path = base.join(ca);
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(&ca_path)
                .map_err(|e| format!("tls_server_config.client_ca_file {}: {e}", ca_path.display()))?
            {
                let cert = cert.map_err(|e| {
                    format!("tls_server_config.client_ca_file {}: {e}", ca_path.display())
                })?;
                roots
                    .add(cert)
                    .map_err(|e| format!("tls_server_config.client_ca_file: {e}"))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if kind == "VerifyClientCertIfGiven" {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| format!("tls_server_config.client_ca_file: {e}"))?,
            )
        }
        (Some(kind), _) => {
            return Err(format!(
                "tls_server_config.client_auth_type {kind:?}: vtax supports NoClientCert, \
                 VerifyClientCertIfGiven and RequireAndVerifyClientCert (the last two need client_ca_file)"
            ))
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls_server_config: the key does not fit the certificate: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

impl Loaded {
    fn new(tls: Option<tokio_rustls::TlsAcceptor>, users: BTreeMap<String, String>) -> Loaded {
        let decoy = users
            .values()
            .max_by_key(|hash| {
                hash.parse::<bcrypt::HashParts>()
                    .map_or(0, |p| p.get_cost())
            })
            .cloned();
        Loaded {
            tls,
            users,
            verified: Mutex::new(HashSet::new()),
            hasher: Default::default(),
            decoy,
        }
    }

    /// What a request's `Authorization` header needs before it may see the
    /// metrics. Cheap: no bcrypt here.
    fn check(&self, authorization: Option<&HeaderValue>) -> Check {
        if self.users.is_empty() {
            return Check::Allowed;
        }
        let Some(value) = authorization.and_then(|v| v.to_str().ok()) else {
            return Check::Denied;
        };
        let key = self.hasher.hash_one(value);
        if self.verified.lock().expect("not poisoned").contains(&key) {
            return Check::Allowed;
        }
        let Some(encoded) = value.strip_prefix("Basic ") else {
            return Check::Denied;
        };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
            return Check::Denied;
        };
        let Ok(decoded) = String::from_utf8(decoded) else {
            return Check::Denied;
        };
        let Some((user, password)) = decoded.split_once(':') else {
            return Check::Denied;
        };
        let (hash, known) = match (self.users.get(user), &self.decoy) {
            (Some(hash), _) => (hash.clone(), true),
            (None, Some(decoy)) => (decoy.clone(), false),
            (None, None) => return Check::Denied,
        };
        Check::Verify(Credential {
            key,
            password: password.to_string(),
            hash,
            known,
        })
    }

    /// Runs bcrypt (tens of milliseconds by design, so never on a serving
    /// thread) and caches a success.
    fn verify(&self, credential: Credential) -> bool {
        // An unknown user is verified against the decoy and refused whatever
        // the outcome: it costs what a known user does.
        let matches = bcrypt::verify(&credential.password, &credential.hash).unwrap_or(false);
        let ok = matches && credential.known;
        if ok {
            let mut verified = self.verified.lock().expect("not poisoned");
            if verified.len() >= VERIFIED_MAX {
                verified.clear();
            }
            verified.insert(credential.key);
        }
        ok
    }
}

/// What a request's credentials need.
enum Check {
    Allowed,
    Denied,
    /// Well formed but not verified yet: bcrypt decides.
    Verify(Credential),
}

struct Credential {
    /// The keyed hash of the whole header, the cache's key.
    key: u64,
    password: String,
    /// The user's hash, or the decoy for an unknown user.
    hash: String,
    known: bool,
}

/// The web config in force, re-read when its file changes.
struct WebConfig {
    path: Option<PathBuf>,
    current: Mutex<(Option<SystemTime>, Arc<Loaded>)>,
}

impl WebConfig {
    fn open(path: Option<PathBuf>) -> Result<WebConfig, WebConfigError> {
        let (mtime, loaded) = match &path {
            None => (None, Loaded::new(None, BTreeMap::new())),
            Some(p) => (modified(p), load(p)?),
        };
        Ok(WebConfig {
            path,
            current: Mutex::new((mtime, Arc::new(loaded))),
        })
    }

    fn current(&self) -> Arc<Loaded> {
        let mut current = self.current.lock().expect("not poisoned");
        if let Some(path) = &self.path {
            let mtime = modified(path);
            if mtime != current.0 {
                current.0 = mtime;
                match load(path) {
                    Ok(loaded) => {
                        tracing::info!(path = %path.display(), "Web config reloaded.");
                        current.1 = Arc::new(loaded);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "Web config changed but does not load; the previous one stays.");
                    }
                }
            }
        }
        current.1.clone()
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Checks a web config file without serving (`vtax check-config`).
pub fn check_web_config(path: &Path) -> Result<(), WebConfigError> {
    load(path).map(|_| ())
}

/// A running `/metrics` server.
pub struct WebServer {
    runtime: Option<tokio::runtime::Runtime>,
    local_addr: SocketAddr,
    shutdown: Arc<tokio::sync::Notify>,
    shared: Arc<Shared>,
}

impl WebServer {
    /// The address it listens on (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What it holds and refused since it started.
    pub fn stats(&self) -> WebStats {
        self.shared.stats()
    }

    /// Publishes [`WebServer::stats`] once a second as a row of [`TABLE`]:
    /// staged in the exposition (shown with the collectors' next render) and
    /// sent on `rows` (the store's channel), so it is stored like any table.
    pub fn publish_stats(&self, rows: std::sync::mpsc::Sender<Vec<Arc<Batch>>>) {
        let Some(runtime) = &self.runtime else {
            return;
        };
        let shared = self.shared.clone();
        runtime.spawn(async move {
            let mut every = tokio::time::interval(STATS_INTERVAL);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let time_us = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as i64);
                let row = Arc::new(shared.stats().row(time_us));
                shared.exposition.stage(STATS_SOURCE, vec![row.clone()]);
                if rows.send(vec![row]).is_err() {
                    return;
                }
            }
        });
    }

    /// Stops accepting and drops open connections.
    pub fn stop(mut self) {
        self.shutdown.notify_waiters();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        }
    }
}

/// Threads serving HTTP: scrapes only copy ready bytes, so two are plenty.
const WEB_THREADS: usize = 2;

/// How often [`WebServer::publish_stats`] publishes.
const STATS_INTERVAL: Duration = Duration::from_secs(1);

/// The exposition's source name of the server's own rows.
const STATS_SOURCE: &str = "web";

/// What every connection of a server shares.
struct Shared {
    exposition: Arc<Exposition>,
    counters: Counters,
    /// One permit per open connection.
    connections: Arc<tokio::sync::Semaphore>,
    max_connections: usize,
    bcrypt_slots: Arc<tokio::sync::Semaphore>,
}

impl Shared {
    fn stats(&self) -> WebStats {
        let counter = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WebStats {
            connections_open: (self.max_connections - self.connections.available_permits()) as u64,
            connections_refused: counter(&self.counters.connections_refused),
            connections_timed_out: counter(&self.counters.connections_timed_out),
            auth_failures: counter(&self.counters.auth_failures),
            auth_busy: counter(&self.counters.auth_busy),
        }
    }
}

/// Starts serving `exposition` on `address`, with the web config file if any,
/// under the default [`WebLimits`].
pub fn serve(
    address: SocketAddr,
    web_config_file: Option<PathBuf>,
    exposition: Arc<Exposition>,
) -> anyhow::Result<WebServer> {
    serve_with(address, web_config_file, exposition, WebLimits::default())
}

/// Starts serving `exposition` on `address` under `limits`.
pub fn serve_with(
    address: SocketAddr,
    web_config_file: Option<PathBuf>,
    exposition: Arc<Exposition>,
    limits: WebLimits,
) -> anyhow::Result<WebServer> {
    let web_config = Arc::new(WebConfig::open(web_config_file)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WEB_THREADS)
        .thread_name("web")
        .enable_io()
        .enable_time()
        .build()?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(address))
        .map_err(|e| anyhow::anyhow!("listen on {address}: {e}"))?;
    let local_addr = listener.local_addr()?;
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let stop = shutdown.clone();
    let shared = Arc::new(Shared {
        exposition,
        counters: Counters::default(),
        connections: Arc::new(tokio::sync::Semaphore::new(limits.max_connections)),
        max_connections: limits.max_connections,
        bcrypt_slots: Arc::new(tokio::sync::Semaphore::new(BCRYPT_SLOTS)),
    });
    let server_shared = shared.clone();
    runtime.spawn(async move {
        let shared = server_shared;
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = stop.notified() => return,
            };
            let Ok(slot) = shared.connections.clone().try_acquire_owned() else {
                bump(&shared.counters.connections_refused);
                tracing::debug!(%peer, "Connection refused: max connections open.");
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let loaded = web_config.current();
            let shared = shared.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                let _slot = slot;
                serve_connection(stream, peer, loaded, shared, &limits).await;
            });
        }
    });
    Ok(WebServer {
        runtime: Some(runtime),
        local_addr,
        shutdown,
        shared,
    })
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    loaded: Arc<Loaded>,
    shared: Arc<Shared>,
    limits: &WebLimits,
) {
    let idle = Arc::new(AtomicBool::new(false));
    let stream = IdleTimeout::new(stream, limits.idle_timeout, idle.clone());
    let service = {
        let loaded = loaded.clone();
        let shared = shared.clone();
        hyper::service::service_fn(move |request| {
            let loaded = loaded.clone();
            let shared = shared.clone();
            async move { Ok::<_, std::convert::Infallible>(handle(request, &loaded, &shared).await) }
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let (result, handshake_timed_out) = match &loaded.tls {
        None => (
            http.serve_connection(TokioIo::new(stream), service).await,
            false,
        ),
        Some(acceptor) => {
            match tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(stream)).await
            {
                Ok(Ok(tls)) => (
                    http.serve_connection(TokioIo::new(tls), service).await,
                    false,
                ),
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    (Ok(()), false)
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    (Ok(()), true)
                }
            }
        }
    };
    // hyper reports the header read timeout; an idle timeout while no
    // request is under way ends the connection as quietly as a client's
    // close would, so the stream says whether it fired.
    let header_timed_out = result.as_ref().is_err_and(|e| e.is_timeout());
    if handshake_timed_out || header_timed_out || idle.load(Ordering::Relaxed) {
        bump(&shared.counters.connections_timed_out);
    }
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// A stream that fails with `TimedOut` once no byte moved either way for
/// `timeout` while a read or a write waits: hyper has no such timeout of its
/// own, and its header read timeout does not cover a client that stops
/// reading a response.
struct IdleTimeout<T> {
    io: T,
    timeout: Duration,
    last_progress: Instant,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Set once the timeout fired.
    expired: Arc<AtomicBool>,
}

impl<T> IdleTimeout<T> {
    fn new(io: T, timeout: Duration, expired: Arc<AtomicBool>) -> Self {
        IdleTimeout {
            io,
            timeout,
            last_progress: Instant::now(),
            sleep: Box::pin(tokio::time::sleep(timeout)),
            expired,
        }
    }

    /// Passes a poll of the inner stream on; while it waits, fails it once
    /// the stream has been idle for the timeout.
    fn progress<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if poll.is_ready() {
            self.last_progress = Instant::now();
            return poll;
        }
        // The timer moves on lazily, when it fires before the deadline,
        // rather than at every read and write.
        let deadline = tokio::time::Instant::from_std(self.last_progress + self.timeout);
        if self.sleep.deadline() != deadline {
            self.sleep.as_mut().reset(deadline);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.expired.store(true, Ordering::Relaxed);
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no byte moved either way for the idle timeout",
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        this.progress(cx, poll)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progress(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progress(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.progress(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_shutdown(cx);
        this.progress(cx, poll)
    }
}

/// Answers one request: the method, then the credentials, then the path.
async fn handle(
    request: Request<Incoming>,
    loaded: &Arc<Loaded>,
    shared: &Shared,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "Only GET and HEAD.\n");
    }
    let allowed = match loaded.check(request.headers().get(header::AUTHORIZATION)) {
        Check::Allowed => true,
        Check::Denied => false,
        Check::Verify(credential) => {
            let Ok(slot) = shared.bcrypt_slots.clone().try_acquire_owned() else {
                bump(&shared.counters.auth_busy);
                let mut r = plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Busy verifying other credentials; retry.\n",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            };
            let loaded = loaded.clone();
            // The slot goes with the verification: a client that hangs up
            // does not free it before bcrypt is done.
            tokio::task::spawn_blocking(move || {
                let _slot = slot;
                loaded.verify(credential)
            })
            .await
            .unwrap_or(false)
        }
    };
    if !allowed {
        bump(&shared.counters.auth_failures);
        let mut r = plain(StatusCode::UNAUTHORIZED, "Unauthorized.\n");
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"vtax\""),
        );
        return r;
    }
    respond(&request, &shared.exposition)
}

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

const LANDING_PAGE: &str = "<html><head><title>vtax</title></head><body>\
<h1>vtax</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n";

/// The answer to an allowed GET or HEAD.
fn respond(request: &Request<Incoming>, exposition: &Exposition) -> Response<Full<Bytes>> {
    match request.uri().path() {
        "/metrics" => {
            let headers = request.headers();
            let format =
                Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
            let gzip = headers
                .get(header::ACCEPT_ENCODING)
                .and_then(|v| v.to_str().ok())
                .is_some_and(accepts_gzip);
            let body = if request.method() == Method::HEAD {
                Bytes::new()
            } else {
                exposition.body(format, gzip)
            };
            let mut r = Response::new(Full::new(body));
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            if gzip {
                h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            h.insert(
                header::VARY,
                HeaderValue::from_static("Accept, Accept-Encoding"),
            );
            r
        }
        "/" => {
            let mut r = Response::new(Full::new(Bytes::from_static(LANDING_PAGE.as_bytes())));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            r
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "Not found: the metrics are at /metrics.\n",
        ),
    }
}

/// Whether an `Accept-Encoding` value allows gzip (and does not refuse it with q=0).
fn accepts_gzip(value: &str) -> bool {
    value.split(',').any(|part| {
        let mut pieces = part.split(';').map(str::trim);
        let coding = pieces.next().unwrap_or("");
        let refused = pieces.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q == 0.0)
        });
        (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_negotiation() {
        assert!(accepts_gzip("gzip"));
        assert!(accepts_gzip("deflate, gzip;q=1.0, *;q=0.5"));
        assert!(!accepts_gzip("gzip;q=0"));
        assert!(!accepts_gzip("identity"));
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn bad_web_configs_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(&write(
            dir.path(),
            "a.yml",
            "basic_auth_users:\n  bob: plain\n",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("basic_auth_users.bob: not a bcrypt hash"),
            "{err}"
        );
        let err = load(&write(
            dir.path(),
            "b.yml",
            "tls_server_confg:\n  cert_file: x\n",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("unknown field `tls_server_confg`"), "{err}");
        let err = load(&write(
            dir.path(),
            "c.yml",
            "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("tls_server_config.cert_file"), "{err}");
        assert!(err.contains("missing.crt"), "{err}");
    }

    /// `check`, then `verify` when it asks for bcrypt.
    fn authorized(loaded: &Loaded, header: Option<&HeaderValue>) -> bool {
        match loaded.check(header) {
            Check::Allowed => true,
            Check::Denied => false,
            Check::Verify(credential) => loaded.verify(credential),
        }
    }

    fn basic(user: &str, pass: &str) -> HeaderValue {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        HeaderValue::from_str(&format!("Basic {token}")).unwrap()
    }

    #[test]
    fn basic_auth_checks_bcrypt_and_caches_success() {
        let dir = tempfile::tempdir().unwrap();
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let loaded = load(&write(
            dir.path(),
            "w.yml",
            &format!("basic_auth_users:\n  prom: {hash}\n"),
        ))
        .unwrap();
        assert!(!authorized(&loaded, None));
        assert!(!authorized(&loaded, Some(&basic("prom", "wrong"))));
        assert!(!authorized(&loaded, Some(&basic("eve", "s3cret"))));
        assert!(authorized(&loaded, Some(&basic("prom", "s3cret"))));
        assert_eq!(loaded.verified.lock().unwrap().len(), 1);
        assert!(matches!(
            loaded.check(Some(&basic("prom", "s3cret"))),
            Check::Allowed
        ));
    }

    /// An unknown user goes through bcrypt like a known one (against the
    /// costliest user's hash), and is refused even with that user's password.
    #[test]
    fn unknown_users_are_verified_against_the_costliest_hash() {
        let mut users = BTreeMap::new();
        users.insert("cheap".to_string(), bcrypt::hash("pw", 4).unwrap());
        users.insert("dear".to_string(), bcrypt::hash("pw", 5).unwrap());
        let loaded = Loaded::new(None, users);
        let Check::Verify(credential) = loaded.check(Some(&basic("eve", "pw"))) else {
            panic!("an unknown user is not refused before bcrypt");
        };
        assert!(!credential.known);
        assert!(
            credential.hash.starts_with("$2b$05$"),
            "{}",
            credential.hash
        );
        assert!(!loaded.verify(credential));
        assert!(loaded.verified.lock().unwrap().is_empty());
    }

    #[test]
    fn the_verified_cache_is_bounded() {
        let mut users = BTreeMap::new();
        users.insert("prom".to_string(), bcrypt::hash("pw", 4).unwrap());
        let loaded = Loaded::new(None, users);
        let token = base64::engine::general_purpose::STANDARD.encode("prom:pw");
        for spaces in 0..=VERIFIED_MAX {
            // Distinct header values that carry the same credential.
            let value = format!("Basic {}{token}", " ".repeat(spaces));
            assert!(authorized(
                &loaded,
                Some(&HeaderValue::from_str(&value).unwrap())
            ));
            assert!(loaded.verified.lock().unwrap().len() <= VERIFIED_MAX);
        }
    }
}
