//! The simulation's seeded generator: SplitMix64 (Steele, Lea and Flood, "Fast splittable
//! pseudorandom number generators", OOPSLA 2014; the constants of Vigna's public-domain
//! `splitmix64.c`). One `u64` of state, a full period of 2^64, good enough statistics for
//! drawing a workload and a nemesis, and no dependency. Not for anything secret.
//!
//! Every draw of a run comes from one seed, through streams split off it by name
//! ([`Prng::stream`]), so adding draws to the workload does not move the nemesis's schedule.

/// A SplitMix64 stream.
#[derive(Debug, Clone)]
pub struct Prng {
    state: u64,
}

impl Prng {
    pub fn new(seed: u64) -> Prng {
        Prng { state: seed }
    }

    /// An independent stream for one concern (`"workload"`, `"nemesis"`), derived from the seed
    /// and the name: the same seed and name give the same stream.
    pub fn stream(seed: u64, name: &str) -> Prng {
        // FNV-1a of the name, mixed into the seed by one SplitMix64 step.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut p = Prng::new(seed ^ h);
        p.next_u64();
        p
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`0` when `n` is 0), by Lemire's multiply-shift (bias below 2^-32 for
    /// the small `n` drawn here).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// One element of `items`, uniformly; `None` when empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            return None;
        }
        items.get(self.below(items.len() as u64) as usize)
    }

    /// One of `items` drawn by weight; `None` when every weight is 0.
    pub fn weighted<T: Copy>(&mut self, items: &[(T, u64)]) -> Option<T> {
        let total: u64 = items.iter().map(|(_, w)| *w).sum();
        if total == 0 {
            return None;
        }
        let mut at = self.below(total);
        for (item, w) in items {
            if at < *w {
                return Some(*item);
            }
            at -= w;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first outputs of seed 0 are the reference implementation's (`splitmix64.c`), so a
    /// seed names the same schedule on every machine and in every later build.
    /// Mutation seen failing: the second multiplier's last digit changed.
    #[test]
    fn seed_zero_gives_the_reference_sequence() {
        let mut p = Prng::new(0);
        assert_eq!(p.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(p.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(p.next_u64(), 0x06c4_5d18_8009_454f);
    }

    /// Named streams of one seed differ from each other and repeat for the same name; draws
    /// stay in their ranges and every weighted item is reachable, none of weight 0.
    /// Mutation seen failing: `stream` ignoring the name (both streams equal).
    #[test]
    fn streams_repeat_by_name_and_draws_stay_in_range() {
        let a: Vec<u64> = (0..4)
            .scan(Prng::stream(7, "workload"), |p, _| Some(p.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(Prng::stream(7, "nemesis"), |p, _| Some(p.next_u64()))
            .collect();
        let a2: Vec<u64> = (0..4)
            .scan(Prng::stream(7, "workload"), |p, _| Some(p.next_u64()))
            .collect();
        assert_ne!(a, b);
        assert_eq!(a, a2);
        let mut p = Prng::new(42);
        let mut seen = [0u32; 3];
        for _ in 0..3000 {
            let r = p.range(5, 9);
            assert!((5..=9).contains(&r));
            let w = p
                .weighted(&[(0usize, 1), (1, 0), (2, 3)])
                .expect("a weight is positive");
            seen[w] += 1;
        }
        assert!(seen[0] > 0 && seen[2] > seen[0]);
        assert_eq!(seen[1], 0);
        assert_eq!(p.weighted(&[(1u8, 0)]), None);
    }
}
