//! Sending queued records to one receiver: an HTTP/1.1 client (reqwest, with
//! rustls over ring for `https`, and the proxy that `HTTPS_PROXY`,
//! `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` name), the remote write 1.0
//! headers, and the retry policy.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{self, HeaderValue};

use super::config::{RemoteWriteConfig, TlsConfig};

/// What to do about a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver took the samples.
    Sent,
    /// Try the same request again after a backoff: the receiver is
    /// overloaded (429), failing (5xx), or unreachable.
    Retry,
    /// The receiver refuses these samples for good (other 4xx): sending them
    /// again would fail again and hold up everything behind them.
    Reject,
}

/// Sorts a response status into an [`Outcome`].
pub fn classify(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Sent,
        429 | 500..=599 => Outcome::Retry,
        // A redirect is followed before a status is classed (307 and 308
        // with the samples, as Prometheus's sender does); a 1xx, or a 3xx
        // still standing after that (no Location, too many hops), is as
        // final as a 4xx.
        _ => Outcome::Reject,
    }
}

/// Exponential backoff between retries with jitter: the ceiling starts at
/// `min` and doubles up to `max`; each wait is half its ceiling plus a random
/// part of the other half. Without the random part every node of a fleet
/// whose receiver came back would retry at the same instants, and the
/// receiver would meet the whole fleet at once, again and again.
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    rng: fastrand::Rng,
}

impl Backoff {
    /// A backoff starting at `min`, its jitter seeded from the system.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self::with_rng(min, max, fastrand::Rng::new())
    }

    /// A backoff whose jitter comes from `rng` (a seeded one, in tests).
    pub fn with_rng(min: Duration, max: Duration, rng: fastrand::Rng) -> Self {
        Backoff {
            min,
            max,
            next: min,
            rng,
        }
    }

    /// The wait before the next retry: between half the ceiling and the
    /// ceiling, which doubles for the one after.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = ceiling / 2;
        half + (ceiling - half).mul_f64(self.rng.f64())
    }

    /// After a success: start from `min` again.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// The bytes of a response's body read for its message.
const RESPONSE_MESSAGE_BYTES: usize = 512;

/// The longest wait a receiver's `Retry-After` is granted. A receiver
/// asking for more (a day, or a date years away, as a misconfigured proxy
/// can) would hold the queue until it filled; the queue is on disk, so
/// waiting this long and asking again loses nothing.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(300);

/// A response: status and the start of its body (the receiver's reason).
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Up to a few hundred bytes of the body.
    pub message: String,
    /// The wait its `Retry-After` asks for, if it has one that reads.
    pub retry_after: Option<Duration>,
}

/// The wait a `Retry-After` value asks for: whole seconds, or an HTTP date
/// (a date already past asks for none). `None` for a value that reads as
/// neither, which is then ignored as if absent, as Prometheus's sender
/// ignores it.
pub fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait before retrying: the backoff's, or longer where the receiver
/// asked for longer (up to [`RETRY_AFTER_MAX`]). A receiver asking for less
/// than the backoff still gets the backoff, so a fleet asked to come back
/// in one second does not come back in the same instant.
pub fn retry_wait(backoff: Duration, asked: Option<Duration>) -> Duration {
    asked.map_or(backoff, |asked| backoff.max(asked.min(RETRY_AFTER_MAX)))
}

/// One receiver's client; it keeps a connection alive between requests and
/// makes a new one whenever it breaks.
pub struct Client {
    http: reqwest::Client,
    url: reqwest::Url,
    config: RemoteWriteConfig,
}

impl Client {
    /// A client for `config` (validated: the URL parses, TLS files load).
    pub fn new(config: &RemoteWriteConfig) -> Result<Client, String> {
        let url =
            reqwest::Url::parse(&config.url).map_err(|e| format!("url {:?}: {e}", config.url))?;
        let https = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => {
                return Err(format!(
                    "url {:?}: the scheme must be http or https",
                    config.url
                ))
            }
        };
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!("url {:?}: no host", config.url));
        }
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("vtax/", env!("CARGO_PKG_VERSION")))
            // Prometheus's sender follows up to ten redirects, as Go's
            // client does: a 307 or 308 again with the samples, a 301, 302
            // or 303 as a GET (which a receiver refuses). Credentials are
            // not carried to another host.
            .redirect(reqwest::redirect::Policy::limited(10))
            .http1_only()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(1);
        if https {
            let tls = client_tls(config.tls.as_ref().unwrap_or(&TlsConfig::default()))?;
            builder = builder.use_preconfigured_tls(tls);
        }
        let http = builder
            .build()
            .map_err(|e| format!("http client: {}", error_chain(&e)))?;
        Ok(Client {
            http,
            url,
            config: config.clone(),
        })
    }

    /// POSTs one snappy-compressed write request; an error is a connection
    /// or protocol failure (worth a retry).
    pub async fn post(&mut self, body: Bytes) -> Result<Response, String> {
        let mut request = self
            .http
            .post(self.url.clone())
            .header(header::CONTENT_ENCODING, "snappy")
            .header(header::CONTENT_TYPE, "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .body(body);
        if let Some(authorization) = self.authorization()? {
            request = request.header(header::AUTHORIZATION, authorization);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("POST {}: {}", self.config.url, error_chain(&e)))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, std::time::SystemTime::now()));
        let redirected_to = response
            .status()
            .is_redirection()
            .then(|| response.headers().get(header::LOCATION))
            .map(|l| {
                l.map_or("nowhere".into(), |l| {
                    String::from_utf8_lossy(l.as_bytes()).into_owned()
                })
            });
        let mut response = response;
        // The start of the body is all the message needs. A receiver that
        // answers with more (a proxy's error page, a URL that serves a file,
        // a stream without end) is not read further: its connection is
        // dropped rather than its body held in the agent's memory. A short
        // body is read to its end, so the connection is kept for the next
        // request.
        let mut body = Vec::new();
        while body.len() < RESPONSE_MESSAGE_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = RESPONSE_MESSAGE_BYTES - body.len();
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                Ok(None) => break,
                Err(e) => return Err(format!("read response: {}", error_chain(&e))),
            }
        }
        let mut message = String::from_utf8_lossy(&body).trim().to_string();
        if let Some(location) = redirected_to {
            // A redirect that could not be followed: say where it pointed.
            message = format!("redirect to {location:?} not followed; {message}");
        }
        Ok(Response {
            status,
            message,
            retry_after,
        })
    }

    /// The `Authorization` header, with secrets read from their files on
    /// every request, so rotated credentials need no restart.
    fn authorization(&self) -> Result<Option<HeaderValue>, String> {
        use base64::Engine as _;
        let value = if let Some(auth) = &self.config.basic_auth {
            let password = match (&auth.password, &auth.password_file) {
                (Some(p), _) => p.clone(),
                (None, Some(file)) => read_secret(file, "basic_auth.password_file")?,
                (None, None) => String::new(),
            };
            let token = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{password}", auth.username));
            format!("Basic {token}")
        } else if let Some(token) = &self.config.bearer_token {
            format!("Bearer {token}")
        } else if let Some(file) = &self.config.bearer_token_file {
            format!("Bearer {}", read_secret(file, "bearer_token_file")?)
        } else {
            return Ok(None);
        };
        let mut value = HeaderValue::from_str(&value)
            .map_err(|_| "credentials hold a control character".to_string())?;
        value.set_sensitive(true);
        Ok(Some(value))
    }
}

/// An error and its causes, "a: b: c": reqwest's own message alone says
/// "error sending request" without saying that the connection was refused.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn read_secret(path: &std::path::Path, key: &str) -> Result<String, String> {
    crate::settings_file::read(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{key} {}: {e}", path.display()))
}

/// Where Debian keeps the system's trusted CAs, used when no `ca_file` is set.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The rustls client config for a `[remote_write.tls]` table.
pub fn client_tls(tls: &TlsConfig) -> Result<rustls::ClientConfig, String> {
    use pki_types::pem::PemObject;
    use pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?;
    let builder = if tls.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
    } else {
        let (path, key) = match &tls.ca_file {
            Some(ca) => (ca.clone(), "tls.ca_file"),
            None => (SYSTEM_CA_BUNDLE.into(), "the system CA bundle"),
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&path)
            .map_err(|e| format!("{key} {}: {e}", path.display()))?
        {
            let cert = cert.map_err(|e| format!("{key} {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("{key} {}: {e}", path.display()))?;
        }
        builder.with_root_certificates(roots)
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| format!("tls.cert_file {}: {e}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("tls.key_file {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("tls.cert_file: {e}"))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err("tls: cert_file and key_file go together".into()),
    }
}

/// `insecure_skip_verify`: any certificate is accepted, but the handshake's
/// signatures are still checked, so the session is at least with the holder
/// of the key the server showed.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &pki_types::CertificateDer<'_>,
        _intermediates: &[pki_types::CertificateDer<'_>],
        _server_name: &pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver that answers with a body without end: the client reads
    /// the message's bytes and no more, and answers at once.
    #[test]
    fn a_response_without_end_is_read_only_for_its_message() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = sent.clone();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let head = "HTTP/1.1 400 Bad Request\r\ncontent-length: 1000000000000\r\n\r\n";
            stream.write_all(head.as_bytes()).unwrap();
            let page = [b'x'; 64 * 1024];
            // Until the client hangs up.
            while stream.write_all(&page).is_ok() {
                counted.fetch_add(page.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let config = RemoteWriteConfig::new("endless", &format!("http://127.0.0.1:{port}/write"));
        let mut client = Client::new(&config).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let response = runtime
            .block_on(async {
                let post = client.post(Bytes::from_static(b"x"));
                tokio::time::timeout(Duration::from_secs(20), post).await
            })
            .expect("answered before the timeout")
            .unwrap();
        assert_eq!(response.status, 400);
        assert_eq!(response.message, "x".repeat(RESPONSE_MESSAGE_BYTES));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        drop(client);
        drop(runtime);
        std::thread::sleep(Duration::from_millis(200));
        // What the socket buffers held when the client went; a body read
        // whole would have been the terabyte, or the timeout.
        let written = sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            written < 64 << 20,
            "{written} bytes written before the client hung up"
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_ignores_the_rest() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(retry_after(" 0 ", now), Some(Duration::ZERO));
        // 2023-11-14T22:13:20Z is `now`; thirty seconds on.
        assert_eq!(
            retry_after("Tue, 14 Nov 2023 22:13:50 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date past asks for no wait"
        );
        for unreadable in ["", "-5", "1.5", "soon", "Tue, 99 Nov 2023"] {
            assert_eq!(retry_after(unreadable, now), None, "{unreadable:?}");
        }
    }

    #[test]
    fn the_receiver_may_lengthen_the_wait_up_to_a_bound_but_never_shorten_it() {
        let backoff = Duration::from_millis(800);
        assert_eq!(retry_wait(backoff, None), backoff);
        assert_eq!(
            retry_wait(backoff, Some(Duration::from_millis(100))),
            backoff
        );
        assert_eq!(
            retry_wait(backoff, Some(Duration::from_secs(20))),
            Duration::from_secs(20)
        );
        assert_eq!(
            retry_wait(backoff, Some(Duration::from_secs(86_400 * 365))),
            RETRY_AFTER_MAX
        );
    }

    #[test]
    fn statuses_sort_into_send_retry_and_reject() {
        assert_eq!(classify(200), Outcome::Sent);
        assert_eq!(classify(204), Outcome::Sent);
        assert_eq!(classify(429), Outcome::Retry);
        assert_eq!(classify(500), Outcome::Retry);
        assert_eq!(classify(503), Outcome::Retry);
        assert_eq!(classify(400), Outcome::Reject);
        assert_eq!(classify(401), Outcome::Reject);
        assert_eq!(classify(404), Outcome::Reject);
        assert_eq!(classify(413), Outcome::Reject);
        assert_eq!(classify(301), Outcome::Reject);
    }

    #[test]
    fn backoff_ceilings_double_up_to_the_cap_and_each_wait_is_within_its_upper_half() {
        let mut b = Backoff::with_rng(
            Duration::from_millis(30),
            Duration::from_millis(200),
            fastrand::Rng::with_seed(7),
        );
        for ceiling_ms in [30, 60, 120, 200, 200] {
            let ceiling = Duration::from_millis(ceiling_ms);
            let delay = b.next_delay();
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
        b.reset();
        let first = b.next_delay();
        assert!(first >= Duration::from_millis(15) && first <= Duration::from_millis(30));
    }

    #[test]
    fn a_fleet_restarting_together_spreads_its_retries() {
        // A thousand nodes whose receiver failed at the same instant: their
        // third retries (ceiling 1.2 s) must not land on a few instants.
        let third_waits: Vec<Duration> = (0..1000)
            .map(|_| {
                let mut b = Backoff::new(Duration::from_millis(300), Duration::from_secs(5));
                b.next_delay();
                b.next_delay();
                b.next_delay()
            })
            .collect();
        let slowest = third_waits.iter().max().unwrap();
        let fastest = third_waits.iter().min().unwrap();
        assert!(*fastest >= Duration::from_millis(600) && *slowest <= Duration::from_millis(1200));
        assert!(
            *slowest - *fastest > Duration::from_millis(400),
            "retries bunched within {:?}",
            *slowest - *fastest
        );
        // No 10 ms slot of the 600 ms spread holds more than 5% of the fleet.
        let mut per_slot = std::collections::BTreeMap::<u128, usize>::new();
        for wait in &third_waits {
            *per_slot.entry(wait.as_millis() / 10).or_default() += 1;
        }
        let busiest = per_slot.values().max().unwrap();
        assert!(
            *busiest <= 50,
            "{busiest} of 1000 retries in one 10 ms slot"
        );
    }
}
