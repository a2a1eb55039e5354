//! Ranking antagonists: which other workload's usage moves with the victim's
//! signal. Both are per-second series over the same look-back; a suspect
//! whose usage rises when the victim suffers, and by a material amount,
//! ranks first.

use std::collections::BTreeMap;

/// Below this correlation a suspect scores nothing: over a look-back of a
/// minute or more, chance alone rarely reaches it.
pub const MIN_CORRELATION: f64 = 0.3;

/// Nor below this t statistic of its correlation, `r √((n−2)/(1−r²))`:
/// about the bar of [`MIN_CORRELATION`] over a look-back of 90 per-second
/// points (r = 0.304 there), and a higher one where the signal has fewer
/// points. A jitter window's tail is one point per window, nine in the
/// look-back: there it asks r = 0.75, above what a workload whose first
/// second fell on a bad window reaches by chance.
pub const MIN_CORRELATION_T: f64 = 3.0;

/// Nor with fewer than this many points on each side of its usage's
/// midpoint: one or two busy seconds make a correlation from a coincidence.
pub const MIN_POINTS_EACH_SIDE: usize = 3;

/// One suspect's standing against one victim signal.
#[derive(Clone, Debug, PartialEq)]
pub struct Suspect {
    pub name: String,
    /// Pearson correlation of the suspect's usage with the victim signal.
    pub correlation: f64,
    /// The victim signal's mean while the suspect was busy minus its mean
    /// while the suspect was quiet, in the signal's own unit.
    pub effect: f64,
    /// How much the suspect's usage changed between its quiet and busy seconds.
    pub usage_change: f64,
    /// The suspect's mean usage in its busy seconds (those above the middle
    /// of its range); its whole mean when its usage is flat.
    pub busy_usage: f64,
    /// correlation × materiality of the usage change, in [0, 1].
    pub score: f64,
}

/// Pearson correlation of two equally long series; 0 when either is flat.
pub fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len().min(y.len());
    if n < 3 {
        return 0.0;
    }
    let (x, y) = (&x[..n], &y[..n]);
    let mean_x = x.iter().sum::<f64>() / n as f64;
    let mean_y = y.iter().sum::<f64>() / n as f64;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        let (dx, dy) = (a - mean_x, b - mean_y);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx <= f64::EPSILON * n as f64 || syy <= f64::EPSILON * n as f64 {
        return 0.0;
    }
    (sxy / (sxx.sqrt() * syy.sqrt())).clamp(-1.0, 1.0)
}

/// Ranks `suspects` (name → per-second usage) against `victim` (per-second
/// signal), all keyed by the second they were sampled in. Only seconds both
/// have count. `usage_scale` is the usage change that counts as material
/// (e.g. 0.05 CPUs): a suspect correlated by chance but using next to
/// nothing scores low.
pub fn rank(
    victim: &BTreeMap<i64, f64>,
    suspects: &BTreeMap<String, BTreeMap<i64, f64>>,
    usage_scale: f64,
) -> Vec<Suspect> {
    let mut ranked: Vec<Suspect> = suspects
        .iter()
        .filter_map(|(name, usage)| {
            let (v, u): (Vec<f64>, Vec<f64>) = victim
                .iter()
                .filter_map(|(second, v)| usage.get(second).map(|u| (*v, *u)))
                .unzip();
            if v.len() < 3 {
                return None;
            }
            let correlation = pearson(&u, &v);
            let Split {
                effect,
                usage_change,
                busy_usage,
                fewest_points,
            } = split_effect(&u, &v);
            let materiality = 1.0 - (-usage_change.max(0.0) / usage_scale).exp();
            let telling = correlation >= MIN_CORRELATION
                && t_statistic(correlation, v.len()) >= MIN_CORRELATION_T
                && fewest_points >= MIN_POINTS_EACH_SIDE;
            Some(Suspect {
                name: name.clone(),
                correlation,
                effect,
                usage_change,
                busy_usage,
                score: if telling {
                    correlation * materiality
                } else {
                    0.0
                },
            })
        })
        .collect();
    sort(&mut ranked);
    ranked
}

/// The t statistic of a correlation `r` over `n` points (infinite at |r| = 1).
fn t_statistic(r: f64, n: usize) -> f64 {
    let rest = 1.0 - r * r;
    if rest <= f64::EPSILON {
        return f64::INFINITY * r.signum();
    }
    r * ((n.saturating_sub(2)) as f64 / rest).sqrt()
}

/// Orders suspects best first: those that score before those that do not,
/// then by their standing (see [`standing`]), then score, then correlation,
/// then name.
pub fn sort(ranked: &mut [Suspect]) {
    let heaviest = heaviest_usage_change(ranked);
    ranked.sort_by(|a, b| {
        (b.score > 0.0)
            .cmp(&(a.score > 0.0))
            .then(standing(b, heaviest).total_cmp(&standing(a, heaviest)))
            .then(b.score.total_cmp(&a.score))
            .then(b.correlation.total_cmp(&a.correlation))
            .then(a.name.cmp(&b.name))
    });
}

/// What a workload lighter than the heaviest scoring one gives up of its
/// standing, at most (in Fisher's z, `atanh r`): about three standard errors
/// of the difference between two correlations over the 90 points of a
/// look-back (`√(2 / (n − 3))` = 0.15). A correlation better by more than
/// this ranks first whatever it used.
pub const ALIKE_Z: f64 = 0.5;

/// Whether `name` is a workload (a cgroup, a GPU process) rather than the
/// sum of what is not one: the host's steal, or the load outside the
/// sampled cgroups.
fn is_workload(name: &str) -> bool {
    name != crate::HYPERVISOR_SUSPECT && name != crate::OUTSIDE_SUSPECT
}

/// The largest usage change among the workloads that score.
fn heaviest_usage_change(ranked: &[Suspect]) -> f64 {
    ranked
        .iter()
        .filter(|s| s.score > 0.0 && is_workload(&s.name))
        .map(|s| s.usage_change)
        .fold(0.0, f64::max)
}

/// A suspect's score in Fisher's z, less [`ALIKE_Z`] in proportion to how
/// much less a workload's usage changed than the heaviest scoring
/// workload's. The score's materiality is full from a few `usage_scale`s on,
/// so a sidecar of 0.2 CPUs that started with a job of 1.9 scored as high as
/// the job, and where its usage happened to follow the victim's noise a
/// little closer (a light, steady workload's step is cleaner than a heavy,
/// busy one's) it was named in the job's place. Between correlations alike,
/// what took more ranks first; a clearly better correlation still does, as a
/// cache thrasher of 0.3 CPUs at r 0.97 beside a bystander of 1 CPU at
/// r 0.64.
///
/// The host's steal and the load outside the cgroups stand on their score,
/// as the heaviest workload does: each is the sum of many things, heavier
/// than any one workload, and weighed by it the load outside (a build, an
/// unsampled service) ranked above a CPU hog that moved with the stall
/// closer (`bench/detect/eval.py`, replayed).
fn standing(suspect: &Suspect, heaviest_usage_change: f64) -> f64 {
    let z = suspect.score.clamp(0.0, 0.999).atanh();
    if suspect.score <= 0.0 || heaviest_usage_change <= 0.0 || !is_workload(&suspect.name) {
        return z;
    }
    let share = (suspect.usage_change / heaviest_usage_change).clamp(0.0, 1.0);
    z - ALIKE_Z * (1.0 - share)
}

/// A suspect's seconds split into busy and quiet.
struct Split {
    /// The victim signal's mean in the busy seconds less its mean in the quiet.
    effect: f64,
    /// The suspect's usage mean in the busy seconds less its mean in the quiet.
    usage_change: f64,
    /// The suspect's usage mean in the busy seconds.
    busy_usage: f64,
    /// Seconds on the side of the split that has fewer.
    fewest_points: usize,
}

/// Splits the seconds at the midpoint of the suspect's usage range into busy
/// and quiet.
fn split_effect(usage: &[f64], victim: &[f64]) -> Split {
    let (lo, hi) = usage
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), u| {
            (lo.min(*u), hi.max(*u))
        });
    let flat = Split {
        effect: 0.0,
        usage_change: 0.0,
        busy_usage: usage.iter().sum::<f64>() / usage.len().max(1) as f64,
        fewest_points: 0,
    };
    if hi - lo <= f64::EPSILON {
        return flat;
    }
    let mid = (lo + hi) / 2.0;
    let mut busy = (0.0, 0.0, 0usize);
    let mut quiet = (0.0, 0.0, 0usize);
    for (u, v) in usage.iter().zip(victim) {
        let side = if *u > mid { &mut busy } else { &mut quiet };
        side.0 += v;
        side.1 += u;
        side.2 += 1;
    }
    if busy.2 == 0 || quiet.2 == 0 {
        return flat;
    }
    let mean = |s: (f64, f64, usize)| (s.0 / s.2 as f64, s.1 / s.2 as f64);
    let (vb, ub) = mean(busy);
    let (vq, uq) = mean(quiet);
    Split {
        effect: vb - vq,
        usage_change: ub - uq,
        busy_usage: ub,
        fewest_points: busy.2.min(quiet.2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(values: impl IntoIterator<Item = f64>) -> BTreeMap<i64, f64> {
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| (i as i64, v))
            .collect()
    }

    #[test]
    fn pearson_of_known_series() {
        assert!((pearson(&[1.0, 2.0, 3.0], &[2.0, 4.0, 6.0]) - 1.0).abs() < 1e-12);
        assert!((pearson(&[1.0, 2.0, 3.0], &[6.0, 4.0, 2.0]) + 1.0).abs() < 1e-12);
        assert_eq!(pearson(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]), 0.0);
        assert_eq!(pearson(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    }

    #[test]
    fn the_hog_that_starts_with_the_stall_ranks_first() {
        // 30 quiet seconds, then 30 with a hog: the victim's stall rises with it.
        let victim =
            series((0..60).map(|i| if i < 30 { 0.01 } else { 0.4 } + (i % 3) as f64 * 0.01));
        let hog = series((0..60).map(|i| if i < 30 { 0.0 } else { 0.98 }));
        // A steady neighbour using a lot, and a tiny one that flickers along.
        let steady = series((0..60).map(|i| 1.0 + (i % 2) as f64 * 0.01));
        let tiny = series((0..60).map(|i| if i < 30 { 0.0 } else { 0.002 }));
        let suspects: BTreeMap<String, _> = [
            ("steady".to_string(), steady),
            ("hog".to_string(), hog),
            ("tiny".to_string(), tiny),
        ]
        .into();
        let ranked = rank(&victim, &suspects, 0.05);
        assert_eq!(ranked[0].name, "hog");
        assert!(ranked[0].correlation > 0.95, "{ranked:?}");
        assert!((ranked[0].effect - 0.39).abs() < 0.02, "{ranked:?}");
        assert!((ranked[0].usage_change - 0.98).abs() < 1e-9);
        assert!((ranked[0].busy_usage - 0.98).abs() < 1e-9);
        assert!(ranked[0].score > 0.9);
        let tiny = ranked.iter().find(|s| s.name == "tiny").unwrap();
        assert!(tiny.correlation > 0.95 && tiny.score < 0.05, "{tiny:?}");
        let steady = ranked.iter().find(|s| s.name == "steady").unwrap();
        assert!(steady.score < 0.2, "{steady:?}");
    }

    /// Nine points, one per jitter window: a newcomer whose first busy
    /// second fell on the window with the worst tail correlates at 0.68 by
    /// that alone (scored 0.68 before), and scores nothing; busy windows
    /// that move with the tail do.
    #[test]
    fn few_points_or_few_busy_ones_are_no_evidence() {
        let tail = series([2.0, 9.0, 3.0, 8.0, 2.5, 7.0, 3.0, 14.0, 3.5]);
        let newcomer = series([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.6, 0.2]);
        let suspects: BTreeMap<String, _> = [("newcomer".to_string(), newcomer)].into();
        let ranked = rank(&tail, &suspects, 0.05);
        assert!(ranked[0].correlation > 0.6, "{ranked:?}");
        assert_eq!(ranked[0].score, 0.0, "{ranked:?}");
        let mover = series([0.0, 0.9, 0.0, 0.8, 0.0, 0.7, 0.0, 1.0, 0.1]);
        let suspects: BTreeMap<String, _> = [("mover".to_string(), mover)].into();
        let ranked = rank(&tail, &suspects, 0.05);
        assert!(ranked[0].score > 0.8, "{ranked:?}");
        assert!(t_statistic(0.31, 90) > MIN_CORRELATION_T);
        assert!(t_statistic(0.74, 9) < MIN_CORRELATION_T);
    }

    /// A job of 1.9 CPUs and its sidecar of 0.2 start together as the
    /// victim's stall begins; the sidecar's usage happens to follow the
    /// stall's noise a little closer. Both correlate well: the job ranks
    /// first.
    #[test]
    fn between_suspects_that_correlate_alike_the_heavier_ranks_first() {
        let wobble = |i: usize| ((i * 7) % 5) as f64 / 4.0 - 0.5;
        let victim = series((0..60).map(|i| if i < 30 { 0.01 } else { 0.4 + 0.02 * wobble(i) }));
        let job = series((0..60).map(|i| {
            if i < 30 {
                0.0
            } else {
                1.9 + 0.8 * wobble(i + 1)
            }
        }));
        let sidecar = series((0..60).map(|i| if i < 30 { 0.0 } else { 0.2 + 0.01 * wobble(i) }));
        let suspects: BTreeMap<String, _> =
            [("job".to_string(), job), ("sidecar".to_string(), sidecar)].into();
        let ranked = rank(&victim, &suspects, 0.05);
        let score = |name: &str| ranked.iter().find(|s| s.name == name).unwrap().score;
        assert!(
            score("sidecar") > score("job") && score("job") > 0.9,
            "the sidecar correlates closer: {ranked:?}"
        );
        assert_eq!(ranked[0].name, "job", "{ranked:?}");
        // A heavy neighbour whose usage barely moves with the stall does not
        // outrank a light one that follows it.
        let follower = series((0..60).map(|i| if i < 30 { 0.0 } else { 0.3 }));
        let churner = series((0..60).map(|i| {
            let rise = if i < 30 { 0.0 } else { 0.7 };
            1.0 + rise + 1.5 * ((i % 7 == 0) as u8 as f64)
        }));
        let suspects: BTreeMap<String, _> = [
            ("follower".to_string(), follower),
            ("churner".to_string(), churner),
        ]
        .into();
        let ranked = rank(&victim, &suspects, 0.05);
        let churner = ranked.iter().find(|s| s.name == "churner").unwrap();
        assert!(
            churner.score > 0.3 && churner.usage_change > 1.0,
            "{ranked:?}"
        );
        assert_eq!(ranked[0].name, "follower", "{ranked:?}");
        // A clearly better correlation ranks first whatever it used: a
        // cache thrasher of 0.3 CPUs beside a bystander of a CPU or two
        // whose usage follows the stall only loosely.
        let jolt = |i: usize| ((i * 11) % 7) as f64 / 6.0 - 0.5;
        let thrasher = series((0..60).map(|i| if i < 30 { 0.0 } else { 0.3 } + 0.1 * jolt(i + 3)));
        let bystander = series((0..60).map(|i| if i < 30 { 0.9 } else { 1.9 } + 1.8 * jolt(i)));
        let suspects: BTreeMap<String, _> = [
            ("thrasher".to_string(), thrasher),
            ("bystander".to_string(), bystander),
        ]
        .into();
        let ranked = rank(&victim, &suspects, 0.05);
        let bystander = ranked.iter().find(|s| s.name == "bystander").unwrap();
        let thrasher = ranked.iter().find(|s| s.name == "thrasher").unwrap();
        assert!(
            (0.5..0.8).contains(&bystander.score)
                && thrasher.score > 0.95
                && bystander.usage_change > 3.0 * thrasher.usage_change,
            "{ranked:?}"
        );
        assert_eq!(ranked[0].name, "thrasher", "{ranked:?}");
        // The load outside the cgroups, heavier than any workload, is not
        // weighed against them: a hog that moves with the stall closer
        // still ranks above it, as it does on score.
        let hog = series((0..60).map(|i| if i < 30 { 0.0 } else { 1.0 + 0.01 * wobble(i) }));
        let outside = series((0..60).map(|i| if i < 30 { 0.5 } else { 3.5 } + 1.2 * wobble(i + 2)));
        let suspects: BTreeMap<String, _> = [
            ("hog".to_string(), hog),
            (crate::OUTSIDE_SUSPECT.to_string(), outside),
        ]
        .into();
        let ranked = rank(&victim, &suspects, 0.05);
        assert!(
            ranked[1].usage_change > 2.0 * ranked[0].usage_change,
            "{ranked:?}"
        );
        assert_eq!(ranked[0].name, "hog", "{ranked:?}");
    }

    #[test]
    fn only_shared_seconds_count() {
        let victim = series([0.0, 0.0, 1.0, 1.0]);
        let mut late: BTreeMap<i64, f64> = BTreeMap::new();
        late.insert(2, 1.0);
        late.insert(3, 1.0);
        let suspects: BTreeMap<String, _> = [("late".to_string(), late)].into();
        assert!(rank(&victim, &suspects, 0.05).is_empty());
    }

    #[test]
    fn a_suspect_that_goes_quiet_when_the_victim_suffers_scores_zero() {
        let victim = series((0..20).map(|i| if i < 10 { 0.0 } else { 1.0 }));
        let victim_itself = series((0..20).map(|i| if i < 10 { 1.0 } else { 0.5 }));
        let suspects: BTreeMap<String, _> = [("starved".to_string(), victim_itself)].into();
        let ranked = rank(&victim, &suspects, 0.05);
        assert!(ranked[0].correlation < -0.9);
        assert_eq!(ranked[0].score, 0.0);
    }
}
