//! A Zipf key population, for the leased mode's model test and the bench:
//! key `i` (from 0) is drawn with weight `1 / (i + 1)^exponent`.

pub struct Zipf {
    /// Each rank's cumulative weight.
    cumulative: Vec<f64>,
}

impl Zipf {
    /// `keys` keys (at least one).
    pub fn new(keys: usize, exponent: f64) -> Zipf {
        let mut total = 0.0;
        let cumulative = (1..=keys.max(1))
            .map(|i| {
                total += 1.0 / (i as f64).powf(exponent);
                total
            })
            .collect();
        Zipf { cumulative }
    }

    /// The share of all draws the top `n` keys take.
    pub fn top_share(&self, n: usize) -> f64 {
        let last = self.cumulative.len() - 1;
        match n {
            0 => 0.0,
            n => self.cumulative[(n - 1).min(last)] / self.cumulative[last],
        }
    }

    /// The rank drawn by `uniform`, a number in [0, 1): 0 the hottest.
    pub fn rank(&self, uniform: f64) -> usize {
        let last = self.cumulative.len() - 1;
        let x = uniform * self.cumulative[last];
        self.cumulative.partition_point(|&c| c < x).min(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_percent_of_100k_keys_carries_half_at_0_92() {
        let zipf = Zipf::new(100_000, 0.92);
        assert!((zipf.top_share(1_000) - 0.5).abs() < 0.01, "{}", zipf.top_share(1_000));
        assert_eq!((zipf.rank(0.0), zipf.rank(0.999_999_999)), (0, 99_999));
        assert_eq!(zipf.top_share(0), 0.0);
        assert_eq!(zipf.top_share(200_000), 1.0);
    }
}
