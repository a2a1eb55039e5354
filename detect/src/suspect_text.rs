//! The `neighbor_events` table's `suspects` text, written and read in one
//! place: `name score=… r=… effect=…` for each suspect, best first, joined
//! by `; `. A cgroup's name may hold `; ` (a directory name may hold any byte
//! but `/`), so a name's `%` and `;` are written `%25` and `%3B`; the words
//! after a name never hold a space, so a name is whatever precedes the last
//! three.

use crate::rank::Suspect;

/// Between two suspects.
const SEPARATOR: &str = "; ";

/// A suspect as the text keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredSuspect {
    pub name: String,
    pub score: f64,
    pub correlation: f64,
    pub effect: f64,
}

/// The text of `suspects`, best first.
pub fn format<'a>(suspects: impl IntoIterator<Item = &'a Suspect>) -> String {
    suspects
        .into_iter()
        .map(|s| {
            format!(
                "{} score={:.2} r={:.2} effect={:.4}",
                encode(&s.name),
                s.score,
                s.correlation,
                s.effect
            )
        })
        .collect::<Vec<_>>()
        .join(SEPARATOR)
}

/// The suspects of a `suspects` text, best first; a part that does not read
/// is left out.
pub fn parse(text: &str) -> Vec<StoredSuspect> {
    text.split(SEPARATOR).filter_map(parse_one).collect()
}

/// The best suspect's name, `None` when the text names none.
pub fn first_name(text: &str) -> Option<String> {
    // The first part's name, not the first that reads: a damaged first
    // part names nobody rather than the second best.
    text.split(SEPARATOR)
        .next()
        .and_then(parse_one)
        .map(|s| s.name)
}

/// One suspect as a person reads it: its name as it is, then its figures.
pub fn display(suspect: &StoredSuspect) -> String {
    format!(
        "{} score={:.2} r={:.2} effect={:.4}",
        suspect.name, suspect.score, suspect.correlation, suspect.effect
    )
}

fn parse_one(part: &str) -> Option<StoredSuspect> {
    let mut words = part.rsplitn(4, ' ');
    let effect = words.next()?.strip_prefix("effect=")?.parse().ok()?;
    let correlation = words.next()?.strip_prefix("r=")?.parse().ok()?;
    let score = words.next()?.strip_prefix("score=")?.parse().ok()?;
    let name = decode(words.next()?);
    (!name.is_empty()).then_some(StoredSuspect {
        name,
        score,
        correlation,
        effect,
    })
}

fn encode(name: &str) -> String {
    name.replace('%', "%25").replace(';', "%3B")
}

/// The inverse of [`encode`]; any other `%` (a row written before names were
/// encoded) is kept as it is.
fn decode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        if let Some(r) = after.strip_prefix("%25") {
            out.push('%');
            rest = r;
        } else if let Some(r) = after.strip_prefix("%3B") {
            out.push(';');
            rest = r;
        } else {
            out.push('%');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suspect(name: &str, score: f64) -> Suspect {
        Suspect {
            name: name.into(),
            correlation: 0.9,
            effect: 0.25,
            usage_change: 1.0,
            busy_usage: 1.0,
            score,
        }
    }

    /// Names a cgroup directory may have: the separator, the words that
    /// follow a name, the escape itself, spaces and a systemd escape.
    #[test]
    fn every_name_reads_back_as_it_was() {
        let names = [
            "/kubepods/pod1/ctr",
            "/a; /b",
            "/c score=9.99 r=1.00 effect=1.0000",
            "/100%;x%3B%25",
            "/system.slice/serial\\x2dgetty@ttyS0.service",
            "unattributed: load outside the cgroups vtax samples",
            "/trailing; ",
        ];
        let suspects: Vec<Suspect> = names
            .iter()
            .enumerate()
            .map(|(i, n)| suspect(n, 1.0 - i as f64 / 10.0))
            .collect();
        let text = format(&suspects);
        let back = parse(&text);
        assert_eq!(
            back.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            names,
            "{text}"
        );
        assert_eq!(back[1].score, 0.9);
        assert_eq!(back[1].correlation, 0.9);
        assert_eq!(back[1].effect, 0.25);
        assert_eq!(first_name(&text).as_deref(), Some("/kubepods/pod1/ctr"));
        assert_eq!(display(&back[1]), "/a; /b score=0.90 r=0.90 effect=0.2500");
    }

    #[test]
    fn rows_written_before_names_were_encoded_still_read() {
        let old = "/pod score=0.81 r=0.90 effect=0.3012; /50% load score=0.20 r=0.30 effect=0.0100";
        let back = parse(old);
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].name, "/pod");
        assert_eq!(back[1].name, "/50% load");
        assert_eq!(first_name(""), None);
        assert_eq!(first_name("garbage"), None);
        assert_eq!(
            first_name("garbage; /b score=0.10 r=0.20 effect=0.0100"),
            None
        );
    }
}
