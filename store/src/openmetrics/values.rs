//! Sample values and timestamps, in the Prometheus text and OpenMetrics
//! forms.

use super::*;

/// Parses a sample value the way Prometheus does (Go's `strconv.ParseFloat` minus hex floats and
/// underscores): decimal with optional fraction and exponent, `[+-]inf`/`[+-]infinity`, `nan`
/// (ASCII case-insensitive). Finite decimals that overflow f64 are an error, as in Go.
pub(super) fn parse_value(s: &str) -> Result<f64, &'static str> {
    let b = s.as_bytes();
    let (neg, rest) = match b.first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    match rest.as_bytes().first() {
        Some(c) if c.is_ascii_digit() || *c == b'.' => {
            // Rust's grammar for what follows a sign and starts with a digit or '.' is exactly
            // `(digits [. digits*] | . digits) [(e|E) [+-] digits]`, the same as Go's decimal form.
            match s.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(v),
                Ok(_) => Err("value out of range for f64"),
                Err(_) => Err("invalid value"),
            }
        }
        Some(b'i' | b'I')
            if rest.eq_ignore_ascii_case("inf") || rest.eq_ignore_ascii_case("infinity") =>
        {
            Ok(if neg {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            })
        }
        Some(b'n' | b'N') if rest.len() == s.len() && rest.eq_ignore_ascii_case("nan") => {
            Ok(f64::from_bits(NORMAL_NAN_BITS))
        }
        None => Err("missing value"),
        _ => Err("invalid value"),
    }
}

/// How the text formats, and Prometheus's HTTP API, spell a value that is not
/// finite: `NaN`, `+Inf`, `-Inf`. `None` for a finite value, which each
/// writer prints in its own number form.
#[inline]
pub fn non_finite_text(value: f64) -> Option<&'static str> {
    if value.is_nan() {
        Some("NaN")
    } else if value == f64::INFINITY {
        Some("+Inf")
    } else if value == f64::NEG_INFINITY {
        Some("-Inf")
    } else {
        None
    }
}

/// Prometheus text timestamp: integer milliseconds (optional sign) → microseconds.
pub(super) fn parse_prom_timestamp_us(s: &str) -> Result<i64, &'static str> {
    let b = s.as_bytes();
    let digits = match b.first() {
        Some(b'+' | b'-') => &b[1..],
        _ => b,
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err("invalid timestamp (Prometheus text wants integer milliseconds)");
    }
    s.parse::<i64>()
        .ok()
        .and_then(|ms| ms.checked_mul(1000))
        .ok_or("timestamp out of range")
}

/// OpenMetrics timestamp: seconds as `[+-]digits[.digits][(e|E)[+-]digits]` → microseconds,
/// without going through a float. Digits below a microsecond are dropped (truncated toward
/// zero): exporters write nanoseconds (the Python client's timestamps have nine fractional
/// digits, a float's `repr` often seven), and Prometheus truncates the same way to its
/// milliseconds, so the millisecond Prometheus stores is the one vtax's microsecond falls in.
pub(super) fn parse_om_timestamp_us(s: &str) -> Result<i64, &'static str> {
    const INVALID: &str = "invalid timestamp (OpenMetrics wants seconds, e.g. 1700000000.123)";
    const RANGE: &str = "timestamp out of range";
    let b = s.as_bytes();
    let mut i = 0;
    let neg = match b.first() {
        Some(b'-') => {
            i = 1;
            true
        }
        Some(b'+') => {
            i = 1;
            false
        }
        _ => false,
    };
    let digits_start = i;
    let mut n_digits: i64 = 0;
    let mut frac_digits: i64 = 0;
    let mut seen_dot = false;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_digit() {
            n_digits += 1;
            if seen_dot {
                frac_digits += 1;
            }
        } else if c == b'.' && !seen_dot {
            seen_dot = true;
        } else {
            break;
        }
        i += 1;
    }
    let digits_end = i;
    if n_digits == 0 {
        return Err(INVALID);
    }
    let mut exp: i64 = 0;
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        let exp_neg = match b.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let exp_start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            // Saturate: anything this large is out of range or below a microsecond anyway.
            exp = (exp * 10 + i64::from(b[i] - b'0')).min(1_000_000);
            i += 1;
        }
        if i == exp_start {
            return Err(INVALID);
        }
        if exp_neg {
            exp = -exp;
        }
    }
    if i != b.len() {
        return Err(INVALID);
    }
    // With D the digits read as one integer (the dot left out), the value in microseconds is
    // D * 10^shift. A negative shift drops D's last -shift digits, which truncates toward zero
    // and keeps the digits that matter from overflowing however many follow.
    let shift = exp - frac_digits + 6;
    let keep = if shift < 0 {
        n_digits + shift
    } else {
        n_digits
    };
    let mut mag: u128 = 0;
    let mut taken: i64 = 0;
    for &c in &b[digits_start..digits_end] {
        if taken >= keep {
            break;
        }
        if c == b'.' {
            continue;
        }
        taken += 1;
        mag = mag
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(c - b'0')))
            .ok_or(RANGE)?;
    }
    if shift > 0 && mag != 0 {
        if shift > 38 {
            return Err(RANGE);
        }
        mag = mag.checked_mul(10u128.pow(shift as u32)).ok_or(RANGE)?;
    }
    if neg {
        if mag > 1u128 << 63 {
            return Err(RANGE);
        }
        Ok((mag as i128).wrapping_neg() as i64)
    } else {
        i64::try_from(mag).map_err(|_| RANGE)
    }
}
