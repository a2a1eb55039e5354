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
