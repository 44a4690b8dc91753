//! Is a series flat after warm-up? A least-squares line through the
//! post-warm-up samples gives the slope, extrapolated to an hour. A series
//! fails only when its slope exceeds the tolerance *beyond noise*: when even
//! the lower end of the slope's 95% confidence interval (slope − 2 standard
//! errors) exceeds the tolerance. A real leak does that, and the longer the
//! run the tighter the interval; the wobble of a busy machine does not.
//! A series may also have a hard bound (e.g. the keys the TTLs allow) that
//! no sample may exceed.
//!
//! A series also has a `step`: the smallest rise it shows by itself (one
//! lease, one waiter, one file, an allocator's growth). Beyond noise, the
//! line must also rise by more than one step over the judged span. In a
//! long run the tolerance asks far more than that, so this changes nothing
//! there; in a short one it keeps a single step (a pool going from 5 leases
//! held to 6 in 30 s, 120 an hour extrapolated) from reading as a leak.

/// How a series is judged. `per_hour` is the largest growth per hour that
/// is not a leak, in the series' unit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tolerance {
    pub(crate) per_hour: f64,
    /// No post-warm-up sample may exceed this.
    pub(crate) bound: Option<f64>,
    /// The smallest rise the series shows by itself, in its unit.
    pub(crate) step: f64,
}

#[derive(Clone, Debug)]
pub(crate) struct Verdict {
    pub(crate) samples: usize,
    pub(crate) mean: f64,
    pub(crate) first: f64,
    pub(crate) last: f64,
    pub(crate) max: f64,
    pub(crate) slope_per_hour: f64,
    /// slope − 2 standard errors, per hour.
    pub(crate) slope_low_per_hour: f64,
    pub(crate) tolerance: Tolerance,
    pub(crate) pass: bool,
    pub(crate) why: String,
}

/// Judges `points` (seconds, value) after `warmup` seconds.
pub(crate) fn judge(points: &[(f64, f64)], warmup: f64, tolerance: Tolerance) -> Verdict {
    let post: Vec<(f64, f64)> =
        points.iter().copied().filter(|(t, v)| *t >= warmup && v.is_finite()).collect();
    let n = post.len();
    let values = || post.iter().map(|(_, v)| *v);
    let mean = if n == 0 { f64::NAN } else { values().sum::<f64>() / n as f64 };
    let max = values().fold(f64::NEG_INFINITY, f64::max);
    let (slope, se) = fit(&post);
    let (slope_per_hour, slope_low_per_hour) = (slope * 3600.0, (slope - 2.0 * se) * 3600.0);
    let span = post.last().map_or(0.0, |p| p.0) - post.first().map_or(0.0, |p| p.0);
    // The least the line rose over the judged span, beyond noise.
    let rise_low = (slope - 2.0 * se) * span;
    let over_bound = tolerance.bound.filter(|b| max > *b);
    let (pass, why) = if n < 3 {
        (false, format!("{n} samples after warm-up: too few to judge"))
    } else if let Some(bound) = over_bound {
        (false, format!("reached {max:.1}, over the bound {bound:.1}"))
    } else if slope_low_per_hour > tolerance.per_hour && rise_low > tolerance.step {
        (
            false,
            format!(
                "grows {slope_per_hour:.1}/h (at least {slope_low_per_hour:.1}/h), over {}/h",
                tolerance.per_hour
            ),
        )
    } else if slope_low_per_hour > tolerance.per_hour {
        (true, format!("flat: rose by at most {rise_low:.1}, within one step ({})", tolerance.step))
    } else if slope_per_hour > tolerance.per_hour {
        (true, "flat: the slope over tolerance is within noise".to_string())
    } else {
        (true, "flat".to_string())
    };
    Verdict {
        samples: n,
        mean,
        first: post.first().map_or(f64::NAN, |p| p.1),
        last: post.last().map_or(f64::NAN, |p| p.1),
        max,
        slope_per_hour,
        slope_low_per_hour,
        tolerance,
        pass,
        why,
    }
}

/// The least-squares slope of `points` and its standard error (per second).
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.len() < 3 {
        return (0.0, f64::INFINITY);
    }
    let (mt, mv) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let stt: f64 = points.iter().map(|(t, _)| (t - mt).powi(2)).sum();
    if stt == 0.0 {
        return (0.0, f64::INFINITY);
    }
    let slope = points.iter().map(|(t, v)| (t - mt) * (v - mv)).sum::<f64>() / stt;
    let intercept = mv - slope * mt;
    let residual: f64 = points.iter().map(|(t, v)| (v - intercept - slope * t).powi(2)).sum();
    let se = (residual / (n - 2.0) / stt).sqrt();
    (slope, se)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance { per_hour: 36.0, bound: None, step: 1.0 };

    /// A steady climb beyond the tolerance fails; the same climb's noise
    /// alone (a wobble around a flat line) passes; warm-up is left out.
    #[test]
    fn a_leak_fails_and_noise_passes() {
        // 0.1 per second is 360 per hour.
        let leak: Vec<(f64, f64)> = (0..60).map(|i| (i as f64 * 5.0, 100.0 + i as f64 * 0.5)).collect();
        let verdict = judge(&leak, 0.0, TOL);
        assert!(!verdict.pass, "{verdict:?}");
        assert!((verdict.slope_per_hour - 360.0).abs() < 1e-6);

        let wobble: Vec<(f64, f64)> =
            (0..60).map(|i| (i as f64 * 5.0, 100.0 + if i % 2 == 0 { 8.0 } else { -8.0 })).collect();
        assert!(judge(&wobble, 0.0, TOL).pass);

        // A ramp during warm-up, flat after it.
        let warm: Vec<(f64, f64)> = (0..60).map(|i| (i as f64 * 5.0, (i as f64 * 10.0).min(100.0))).collect();
        assert!(!judge(&warm, 0.0, TOL).pass);
        assert!(judge(&warm, 50.0, TOL).pass);
    }

    /// A hard bound fails the series whatever its slope; too few samples fail.
    #[test]
    fn bounds_and_too_few_samples() {
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 50.0)).collect();
        assert!(judge(&flat, 0.0, TOL).pass);
        assert!(!judge(&flat, 0.0, Tolerance { per_hour: 36.0, bound: Some(40.0), step: 1.0 }).pass);
        assert!(!judge(&flat, 8.5, TOL).pass);
    }

    /// Regression: a 60-second soak failed on its pool's leases, which went
    /// from 5 held to 6 halfway through its 30 judged seconds (a step, 120
    /// an hour extrapolated, against 8). One step is not a leak; a climb of
    /// one lease every 5 s over the same span is.
    #[test]
    fn one_step_in_a_short_run_is_not_a_leak() {
        let tol = Tolerance { per_hour: 8.0, bound: Some(8.0), step: 1.0 };
        let step: Vec<(f64, f64)> =
            (0..16).map(|i| (30.0 + 2.0 * i as f64, if i < 8 { 5.0 } else { 6.0 })).collect();
        let verdict = judge(&step, 30.0, tol);
        assert!(verdict.pass, "{verdict:?}");
        assert!(
            verdict.slope_low_per_hour > tol.per_hour,
            "the slope alone would have failed it: {verdict:?}"
        );

        let climb: Vec<(f64, f64)> = (0..16).map(|i| (30.0 + 2.0 * i as f64, (i / 3) as f64)).collect();
        assert!(!judge(&climb, 30.0, Tolerance { bound: None, ..tol }).pass);
    }
}
