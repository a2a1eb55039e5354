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
    pub(super) basic_auth_users: BTreeMap<String, String>,
}

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
    /// The hash an unknown user is verified against: the costliest user's.
    pub(super) decoy: Option<String>,
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
    Ok(Loaded::new(tls, file.basic_auth_users))
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
            decoy,
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
    pub(super) fn verify(&self, credential: Credential) -> bool {
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
