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

use std::collections::{BTreeMap, HashSet};
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;

use crate::exposition::{Exposition, Format};

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
    Ok(Loaded {
        tls,
        users: file.basic_auth_users,
        verified: Mutex::new(HashSet::new()),
        hasher: Default::default(),
    })
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
    /// Whether a request may see the metrics.
    fn authorized(&self, authorization: Option<&HeaderValue>) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let Some(value) = authorization.and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let key = self.hasher.hash_one(value);
        if self.verified.lock().expect("not poisoned").contains(&key) {
            return true;
        }
        let Some(encoded) = value.strip_prefix("Basic ") else {
            return false;
        };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
            return false;
        };
        let Ok(decoded) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, password)) = decoded.split_once(':') else {
            return false;
        };
        let ok = self
            .users
            .get(user)
            .is_some_and(|hash| bcrypt::verify(password, hash).unwrap_or(false));
        if ok {
            self.verified.lock().expect("not poisoned").insert(key);
        }
        ok
    }
}

/// The web config in force, re-read when its file changes.
struct WebConfig {
    path: Option<PathBuf>,
    current: Mutex<(Option<SystemTime>, Arc<Loaded>)>,
}

impl WebConfig {
    fn open(path: Option<PathBuf>) -> Result<WebConfig, WebConfigError> {
        let (mtime, loaded) = match &path {
            None => (
                None,
                Loaded {
                    tls: None,
                    users: BTreeMap::new(),
                    verified: Mutex::new(HashSet::new()),
                    hasher: Default::default(),
                },
            ),
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
}

impl WebServer {
    /// The address it listens on (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
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

/// Starts serving `exposition` on `address`, with the web config file if any.
pub fn serve(
    address: SocketAddr,
    web_config_file: Option<PathBuf>,
    exposition: Arc<Exposition>,
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
    runtime.spawn(async move {
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
            let _ = stream.set_nodelay(true);
            let loaded = web_config.current();
            let exposition = exposition.clone();
            tokio::spawn(async move {
                let service = {
                    let loaded = loaded.clone();
                    hyper::service::service_fn(move |request| {
                        let response = respond(&request, &exposition, &loaded);
                        async move { Ok::<_, std::convert::Infallible>(response) }
                    })
                };
                let http = hyper::server::conn::http1::Builder::new();
                let result = match &loaded.tls {
                    None => http.serve_connection(TokioIo::new(stream), service).await,
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(tls) => http.serve_connection(TokioIo::new(tls), service).await,
                        Err(e) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                    },
                };
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            });
        }
    });
    Ok(WebServer {
        runtime: Some(runtime),
        local_addr,
        shutdown,
    })
}

const LANDING_PAGE: &str = "<html><head><title>vtax</title></head><body>\
<h1>vtax</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n";

fn respond(
    request: &Request<Incoming>,
    exposition: &Exposition,
    loaded: &Loaded,
) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "Only GET and HEAD.\n");
    }
    if !loaded.authorized(request.headers().get(header::AUTHORIZATION)) {
        let mut r = plain(StatusCode::UNAUTHORIZED, "Unauthorized.\n");
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"vtax\""),
        );
        return r;
    }
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
        let header = |user: &str, pass: &str| {
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
            HeaderValue::from_str(&format!("Basic {token}")).unwrap()
        };
        assert!(!loaded.authorized(None));
        assert!(!loaded.authorized(Some(&header("prom", "wrong"))));
        assert!(!loaded.authorized(Some(&header("eve", "s3cret"))));
        assert!(loaded.authorized(Some(&header("prom", "s3cret"))));
        assert_eq!(loaded.verified.lock().unwrap().len(), 1);
        assert!(loaded.authorized(Some(&header("prom", "s3cret"))));
    }
}
