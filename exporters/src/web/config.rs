//! `--web.config.file`: TLS and basic auth, read and checked, and the
//! credential check of each request.

use super::*;

/// Why a web config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    /// Reading a file failed.
    #[error("{path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why; in the message, not also as its source, or a chain of
        /// causes says it twice.
        error: std::io::Error,
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
pub(super) struct WebConfigFile {
    #[serde(default)]
    pub(super) tls_server_config: Option<TlsServerConfig>,
    #[serde(default)]
    pub(super) http_server_config: Option<HttpServerConfig>,
    #[serde(default)]
    pub(super) basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HttpServerConfig {
    /// Taken for the exporters' format and not acted on: the server speaks
    /// HTTP/1.1, which every scraper speaks, and offers only it over TLS.
    #[serde(default, rename = "http2")]
    pub(super) _http2: Option<bool>,
    /// Headers added to every response; the exporters' format allows the
    /// security headers of [`RESPONSE_HEADERS`] only.
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
}

/// The response headers a web config may set, as the exporters' format
/// allows them, each with the values it takes (`None`: any).
const RESPONSE_HEADERS: &[(&str, Option<&[&str]>)] = &[
    ("Content-Security-Policy", None),
    ("X-Frame-Options", Some(&["deny", "sameorigin"])),
    ("X-Content-Type-Options", Some(&["nosniff"])),
    ("X-XSS-Protection", None),
    ("Strict-Transport-Security", None),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TlsServerConfig {
    pub(super) cert_file: PathBuf,
    pub(super) key_file: PathBuf,
    #[serde(default)]
    pub(super) client_ca_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) client_auth_type: Option<String>,
    #[serde(default)]
    pub(super) min_version: Option<String>,
    #[serde(default)]
    pub(super) max_version: Option<String>,
    /// TLS 1.2 suites by their IANA names, as Go names them; TLS 1.3's are
    /// always on (Go does not let them be chosen either).
    #[serde(default)]
    pub(super) cipher_suites: Vec<String>,
    #[serde(default)]
    pub(super) prefer_server_cipher_suites: Option<bool>,
    /// Key exchange groups by Go's names (`X25519`, `CurveP256`, ...).
    #[serde(default)]
    pub(super) curve_preferences: Vec<String>,
}

/// A loaded web config: TLS acceptor and users.
pub(super) struct Loaded {
    pub(super) tls: Option<tokio_rustls::TlsAcceptor>,
    pub(super) users: BTreeMap<String, String>,
    /// Credentials already verified against their bcrypt hash, as keyed hashes
    /// of the `Authorization` header: bcrypt is slow on purpose, and a scraper
    /// sends the same header every few seconds.
    pub(super) verified: Mutex<HashSet<u64>>,
    pub(super) hasher: std::collections::hash_map::RandomState,
    /// Credentials bcrypt refused, as keyed hashes of the header: a client
    /// that repeats a wrong password is answered from here, not by bcrypt.
    pub(super) refused: Mutex<HashSet<u64>>,
    /// The hash an unknown user is verified against: the costliest user's.
    pub(super) decoy: Option<String>,
    /// `http_server_config.headers`, added to every response.
    pub(super) headers: Vec<(header::HeaderName, HeaderValue)>,
}

/// Parses and loads a web config file, certificates included.
pub(super) fn load(path: &Path) -> Result<Loaded, WebConfigError> {
    let name = path.display().to_string();
    let text = crate::settings_file::read(path).map_err(|error| WebConfigError::Read {
        path: name.clone(),
        error,
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
    let headers = match &file.http_server_config {
        None => Vec::new(),
        Some(http) => response_headers(&http.headers).map_err(invalid)?,
    };
    let mut loaded = Loaded::new(tls, file.basic_auth_users);
    loaded.headers = headers;
    Ok(loaded)
}

/// `http_server_config.headers`, checked as the exporters check them: a
/// header they do not allow, or a value they refuse, is an error.
fn response_headers(
    configured: &BTreeMap<String, String>,
) -> Result<Vec<(header::HeaderName, HeaderValue)>, String> {
    let mut out = Vec::new();
    for (name, value) in configured {
        let Some((known, values)) = RESPONSE_HEADERS
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
        else {
            let allowed: Vec<&str> = RESPONSE_HEADERS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "http_server_config.headers.{name}: not a header the web config sets (it sets {})",
                allowed.join(", ")
            ));
        };
        if value.is_empty() {
            continue;
        }
        if let Some(values) = values {
            if !values.iter().any(|v| v.eq_ignore_ascii_case(value)) {
                return Err(format!(
                    "http_server_config.headers.{known}: {value:?} is not one of {}",
                    values.join(", ")
                ));
            }
        }
        let value = HeaderValue::from_str(value).map_err(|_| {
            format!("http_server_config.headers.{known}: {value:?} is not a header value")
        })?;
        out.push((header::HeaderName::from_static(lowercase(known)), value));
    }
    Ok(out)
}

/// The lower-case form of a header of [`RESPONSE_HEADERS`], as
/// `HeaderName::from_static` wants it.
fn lowercase(name: &str) -> &'static str {
    match name {
        "Content-Security-Policy" => "content-security-policy",
        "X-Frame-Options" => "x-frame-options",
        "X-Content-Type-Options" => "x-content-type-options",
        "X-XSS-Protection" => "x-xss-protection",
        _ => "strict-transport-security",
    }
}

/// A TLS version named in the web config.
fn tls_version(key: &str, name: &str) -> Result<&'static rustls::SupportedProtocolVersion, String> {
    match name {
        "TLS12" => Ok(&rustls::version::TLS12),
        "TLS13" => Ok(&rustls::version::TLS13),
        "TLS10" | "TLS11" => Err(format!(
            "tls_server_config.{key} {name:?}: TLS 1.0 and 1.1 are not offered (vtax speaks TLS12 and TLS13)"
        )),
        other => Err(format!(
            "tls_server_config.{key} {other:?}: vtax supports TLS12 and TLS13"
        )),
    }
}

/// The crypto provider the web config asks for: its TLS 1.2 suites and key
/// exchange groups, in its order, each name checked.
fn provider_for(tls: &TlsServerConfig) -> Result<rustls::crypto::CryptoProvider, String> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !tls.cipher_suites.is_empty() {
        let all = provider.cipher_suites.clone();
        // rustls names TLS 1.3's suites TLS13_*, Go and IANA TLS_*.
        let name_of = |s: &rustls::SupportedCipherSuite| {
            let name = s.suite().as_str().unwrap_or("");
            match name.strip_prefix("TLS13_") {
                Some(rest) => format!("TLS_{rest}"),
                None => name.to_string(),
            }
        };
        let mut chosen: Vec<rustls::SupportedCipherSuite> = all
            .iter()
            .filter(|s| s.tls13().is_some())
            .copied()
            .collect();
        for name in &tls.cipher_suites {
            match all.iter().find(|s| name_of(s) == *name) {
                Some(suite) if suite.tls13().is_some() => {}
                Some(suite) => chosen.push(*suite),
                None => {
                    let offered = all
                        .iter()
                        .filter(|s| s.tls13().is_none())
                        .map(name_of)
                        .collect::<Vec<String>>();
                    return Err(format!(
                        "tls_server_config.cipher_suites: {name:?} is not offered (TLS 1.2 suites offered: {})",
                        offered.join(", ")
                    ));
                }
            }
        }
        provider.cipher_suites = chosen;
    }
    if !tls.curve_preferences.is_empty() {
        use rustls::NamedGroup;
        let all = provider.kx_groups.clone();
        let mut chosen = Vec::new();
        for name in &tls.curve_preferences {
            let group = match name.as_str() {
                "X25519" => Some(NamedGroup::X25519),
                "CurveP256" => Some(NamedGroup::secp256r1),
                "CurveP384" => Some(NamedGroup::secp384r1),
                _ => None,
            };
            let Some(kx) = group.and_then(|g| all.iter().find(|k| k.name() == g)) else {
                return Err(format!(
                    "tls_server_config.curve_preferences: {name:?} is not offered (X25519, CurveP256 and CurveP384 are)"
                ));
            };
            chosen.push(*kx);
        }
        provider.kx_groups = chosen;
    }
    Ok(provider)
}

pub(super) fn tls_acceptor(
    tls: &TlsServerConfig,
    base: &Path,
) -> Result<tokio_rustls::TlsAcceptor, String> {
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
    let provider = Arc::new(provider_for(tls)?);
    let min = tls_version("min_version", tls.min_version.as_deref().unwrap_or("TLS12"))?;
    let max = tls_version("max_version", tls.max_version.as_deref().unwrap_or("TLS13"))?;
    let versions: Vec<&rustls::SupportedProtocolVersion> =
        [&rustls::version::TLS13, &rustls::version::TLS12]
            .into_iter()
            .filter(|v| {
                let n = u16::from(v.version);
                n >= u16::from(min.version) && n <= u16::from(max.version)
            })
            .collect();
    if versions.is_empty() {
        return Err("tls_server_config: min_version is above max_version".into());
    }
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls_server_config: {e}"))?;
    let builder = match (tls.client_auth_type.as_deref(), &tls.client_ca_file) {
        // The exporters refuse this too: a CA that asks no client for a
        // certificate would let in every client its operator meant to keep out.
        (None | Some("NoClientCert"), Some(_)) => {
            return Err(
                "tls_server_config.client_ca_file is set but client_auth_type is NoClientCert \
                 (its default), so no client would be asked for a certificate: set \
                 client_auth_type to RequireAndVerifyClientCert or VerifyClientCertIfGiven"
                    .into(),
            )
        }
        (None | Some("NoClientCert"), None) => builder.with_no_client_auth(),
        (Some(kind @ ("RequireAndVerifyClientCert" | "VerifyClientCertIfGiven")), Some(ca)) => {
            let ca_path = base.join(ca);
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(&ca_path).map_err(|e| {
                format!(
                    "tls_server_config.client_ca_file {}: {e}",
                    ca_path.display()
                )
            })? {
                let cert = cert.map_err(|e| {
                    format!(
                        "tls_server_config.client_ca_file {}: {e}",
                        ca_path.display()
                    )
                })?;
                roots
                    .add(cert)
                    .map_err(|e| format!("tls_server_config.client_ca_file: {e}"))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
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
                 VerifyClientCertIfGiven and RequireAndVerifyClientCert, the last two with \
                 client_ca_file (a client certificate is always verified against it)"
            ))
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls_server_config: the key does not fit the certificate: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // The exporters' default: the server's order of suites wins.
    config.ignore_client_order = tls.prefer_server_cipher_suites.unwrap_or(true);
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

impl Loaded {
    pub(super) fn new(
        tls: Option<tokio_rustls::TlsAcceptor>,
        users: BTreeMap<String, String>,
    ) -> Loaded {
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
            refused: Mutex::new(HashSet::new()),
            decoy,
            headers: Vec::new(),
        }
    }

    /// What a request's `Authorization` header needs before it may see the
    /// metrics. Cheap: no bcrypt here.
    pub(super) fn check(&self, authorization: Option<&HeaderValue>) -> Check {
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
        if self.refused.lock().expect("not poisoned").contains(&key) {
            return Check::Denied;
        }
        // The scheme's name is case-insensitive (RFC 9110).
        let encoded = match value.split_once(' ') {
            Some((scheme, encoded)) if scheme.eq_ignore_ascii_case("basic") => encoded,
            _ => return Check::Denied,
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
    /// thread) and caches the outcome.
    pub(super) fn verify(&self, credential: Credential) -> bool {
        // An unknown user is verified against the decoy and refused whatever
        // the outcome: it costs what a known user does.
        let matches = bcrypt::verify(&credential.password, &credential.hash).unwrap_or(false);
        let ok = matches && credential.known;
        let (cache, max) = if ok {
            (&self.verified, VERIFIED_MAX)
        } else {
            (&self.refused, REFUSED_MAX)
        };
        let mut cache = cache.lock().expect("not poisoned");
        if cache.len() >= max {
            cache.clear();
        }
        cache.insert(credential.key);
        ok
    }
}

/// What a request's credentials need.
pub(super) enum Check {
    Allowed,
    Denied,
    /// Well formed but not verified yet: bcrypt decides.
    Verify(Credential),
}

pub(super) struct Credential {
    /// The keyed hash of the whole header, the cache's key.
    pub(super) key: u64,
    pub(super) password: String,
    /// The user's hash, or the decoy for an unknown user.
    pub(super) hash: String,
    pub(super) known: bool,
}

impl WebConfig {
    pub(super) fn open(path: Option<PathBuf>) -> Result<WebConfig, WebConfigError> {
        let (mtime, loaded) = match &path {
            None => (None, Loaded::new(None, BTreeMap::new())),
            Some(p) => (modified(p), load(p)?),
        };
        Ok(WebConfig {
            path,
            current: Mutex::new((mtime, Arc::new(loaded))),
        })
    }

    pub(super) fn current(&self) -> Arc<Loaded> {
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
