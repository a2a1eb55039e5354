//! Tests of the module.

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

/// A self-signed certificate and its key, written beside the config.
fn write_cert(dir: &Path) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.join("server.crt"), cert.cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), cert.signing_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("ca.crt"), cert.cert.pem()).unwrap();
}

fn load_tls(dir: &Path, extra: &str) -> Result<Loaded, String> {
    let text =
        format!("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n{extra}");
    load(&write(dir, "tls.yml", &text)).map_err(|e| e.to_string())
}

/// What node_exporter's web config takes, vtax takes or refuses as it does;
/// a client CA with no client_auth_type, which would let every client in,
/// is refused as the exporters refuse it.
#[test]
fn tls_settings_of_the_exporters_format_are_taken_or_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write_cert(dir.path());
    for ok in [
        "",
        "  min_version: TLS13\n",
        "  min_version: TLS12\n  max_version: TLS12\n",
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n",
        "  curve_preferences: [X25519, CurveP256]\n  prefer_server_cipher_suites: false\n",
        "  client_ca_file: ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n",
    ] {
        assert!(
            load_tls(dir.path(), ok).is_ok(),
            "{ok}: {:?}",
            load_tls(dir.path(), ok).err()
        );
    }
    for (bad, says) in [
        (
            "  client_ca_file: ca.crt\n",
            "client_auth_type is NoClientCert",
        ),
        (
            "  client_ca_file: ca.crt\n  client_auth_type: NoClientCert\n",
            "no client would be asked for a certificate",
        ),
        ("  min_version: TLS10\n", "TLS 1.0 and 1.1 are not offered"),
        (
            "  min_version: TLS13\n  max_version: TLS12\n",
            "min_version is above max_version",
        ),
        (
            "  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n",
            "is not offered",
        ),
        (
            "  curve_preferences: [CurveP521]\n",
            "\"CurveP521\" is not offered",
        ),
        (
            "  client_auth_type: RequireAnyClientCert\n",
            "client_ca_file",
        ),
    ] {
        let e = load_tls(dir.path(), bad).err().unwrap_or_default();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

/// The security headers the exporters' format sets go on every answer;
/// another header, or a value the format refuses, is refused.
#[test]
fn response_headers_are_those_the_exporters_format_allows() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = load(&write(
        dir.path(),
        "h.yml",
        "http_server_config:\n  http2: false\n  headers:\n    x-content-type-options: NoSniff\n    \
         Strict-Transport-Security: max-age=31536000\n",
    ))
    .unwrap();
    let names: Vec<&str> = loaded.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["strict-transport-security", "x-content-type-options"]
    );
    for (bad, says) in [
        ("Server: vtax", "not a header the web config sets"),
        (
            "X-Frame-Options: allow",
            "\"allow\" is not one of deny, sameorigin",
        ),
    ] {
        let e = load(&write(
            dir.path(),
            "bad.yml",
            &format!("http_server_config:\n  headers:\n    {bad}\n"),
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

/// The scheme's name is case-insensitive; a refused credential is answered
/// from its cache the next time, without bcrypt.
#[test]
fn basic_auth_takes_any_case_of_the_scheme_and_caches_a_refusal() {
    let mut users = BTreeMap::new();
    users.insert("prom".to_string(), bcrypt::hash("pw", 4).unwrap());
    let loaded = Loaded::new(None, users);
    let token = base64::engine::general_purpose::STANDARD.encode("prom:pw");
    let lower = HeaderValue::from_str(&format!("basic {token}")).unwrap();
    assert!(authorized(&loaded, Some(&lower)));
    let wrong = basic("prom", "nope");
    assert!(!authorized(&loaded, Some(&wrong)));
    assert!(matches!(loaded.check(Some(&wrong)), Check::Denied));
}

fn shared_of(max_connections: usize) -> Shared {
    Shared {
        exposition: Exposition::new(&[]),
        counters: Counters::default(),
        connections: Arc::new(tokio::sync::Semaphore::new(max_connections)),
        max_connections,
        bcrypt_slots: Arc::new(tokio::sync::Semaphore::new(BCRYPT_SLOTS)),
        open: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        started: Instant::now(),
    }
}

/// Room is made by closing a connection writing no answer, the one whose
/// last request began longest ago; one writing an answer (until its body is
/// written and dropped) is never closed, and with every connection writing
/// one there is no room to make.
#[test]
fn room_is_made_only_from_connections_writing_no_answer() {
    let shared = shared_of(2);
    let older = shared.track();
    std::thread::sleep(Duration::from_millis(5));
    let newer = shared.track();
    let answering = older.answering();
    assert!(shared.evict_longest_waiting());
    assert!(!shared.open.lock().unwrap().contains_key(&newer.id));
    assert!(shared.open.lock().unwrap().contains_key(&older.id));
    assert!(
        !shared.evict_longest_waiting(),
        "the only one left writes an answer"
    );
    drop(answering);
    assert!(
        shared.evict_longest_waiting(),
        "its body written, it may go"
    );
    assert_eq!(shared.stats().connections_evicted, 2);
}

/// Every interface of IPv6, what `:port` means, takes IPv4 too, whatever
/// the host's `net.ipv6.bindv6only`: set, the agent answered no IPv4 scrape.
#[test]
fn every_interface_takes_ipv4_and_ipv6() {
    let listener = super::server::bind_listener("[::]:0".parse().unwrap()).unwrap();
    assert!(!socket2::SockRef::from(&listener).only_v6().unwrap());
    let port = listener.local_addr().unwrap().port();
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("IPv4 reaches it");
    // An address of one family is bound as it is.
    let v4 = super::server::bind_listener("127.0.0.1:0".parse().unwrap()).unwrap();
    assert!(v4.local_addr().unwrap().is_ipv4());
}
