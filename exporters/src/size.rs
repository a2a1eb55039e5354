//! Byte sizes in the config file and on the command line: a plain integer
//! of bytes, or a string with a unit (`"10GB"`, `"512MiB"`, `"1.5 GiB"`).
//! `KB`, `MB`, `GB`... are powers of 1000 and `KiB`, `MiB`, `GiB`... powers of
//! 1024, as systemd's `MemoryMax=` and Prometheus' `--storage.tsdb.retention.size`
//! read them. It lives here, the lowest crate whose config (`[[remote_write]]`'s
//! `queue_max_bytes`) holds a size.

use serde::de::{self, Deserializer, Visitor};

/// `"10GB"` → 10 000 000 000; a bare number is bytes. The message says what
/// a size looks like.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .parse_size(text.trim())
        .map_err(|e| format!("{text:?} is not a size ({e}): bytes, or a number with a unit such as \"512MiB\" or \"10GB\""))
}

/// For `#[serde(deserialize_with = "...")]` on a `_bytes` key: takes an
/// integer (bytes) or a string with a unit.
pub fn deserialize_bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct Bytes;
    impl Visitor<'_> for Bytes {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a size: bytes, or a string such as \"512MiB\" or \"10GB\"")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("{v} is not a size: it is negative")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse_bytes(v).map_err(E::custom)
        }
    }
    deserializer.deserialize_any(Bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Holder {
        #[serde(deserialize_with = "deserialize_bytes")]
        size_bytes: u64,
    }

    fn holder(value: &str) -> Result<u64, String> {
        serde_yaml_ng::from_str::<Holder>(&format!("size_bytes: {value}"))
            .map(|h| h.size_bytes)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn units_are_decimal_or_binary_as_written() {
        assert_eq!(parse_bytes("10GB"), Ok(10_000_000_000));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("2mib"), Ok(2 << 20));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes(" 1 KB "), Ok(1000));
    }

    #[test]
    fn a_non_size_says_what_a_size_looks_like() {
        for junk in ["", "ten", "10XB", "-1MB", "1e30"] {
            let e = parse_bytes(junk).unwrap_err();
            assert!(
                e.contains("is not a size") && e.contains("512MiB"),
                "{junk}: {e}"
            );
        }
    }

    #[test]
    fn a_key_takes_an_integer_or_a_string_with_a_unit() {
        assert_eq!(holder("1048576"), Ok(1 << 20));
        assert_eq!(holder("\"1MiB\""), Ok(1 << 20));
        assert!(holder("-5").unwrap_err().contains("negative"));
        assert!(holder("\"lots\"").unwrap_err().contains("is not a size"));
    }
}
