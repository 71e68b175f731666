//! SplitMix64 (Steele, Lea & Flood 2014): the small deterministic RNG of the host side of Ember
//! (sampler uniforms, task generation, shuffles). Its whole state is one `u64`, so checkpoints
//! can store it and runs reproduce from a seed alone.

use serde::{Deserialize, Serialize};

/// The generator; the field is its state (the seed at creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitMix64(pub u64);

/// rand's traits (rand_core 0.10, burn 0.22's): a `SplitMix64` is a generator for rand's
/// distributions and `shuffle`, drawing the same stream as [`SplitMix64::next_u64`]; a 32-bit
/// draw is the high half of the next 64 bits.
impl rand_core::TryRng for SplitMix64 {
    type Error = core::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((SplitMix64::next_u64(self) >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(SplitMix64::next_u64(self))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        rand_core::utils::fill_bytes_via_next_word(dst, || Ok(SplitMix64::next_u64(self)))
    }
}

/// Seeding through rand: the 8 bytes (little-endian) are the state.
impl rand_core::SeedableRng for SplitMix64 {
    type Seed = [u8; 8];

    fn from_seed(seed: Self::Seed) -> Self {
        Self(u64::from_le_bytes(seed))
    }
}

impl SplitMix64 {
    /// The stream of `seed` after `draws` draws (SplitMix64's state moves by a constant per
    /// draw, so any position is reached at once): `at(s, k).next_u64()` is the (k+1)-th
    /// `SplitMix64(s).next_u64()`.
    pub fn at(seed: u64, draws: u64) -> Self {
        Self(seed.wrapping_add(draws.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform f32 in [0, 1) with 24 random bits.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A uniform f64 in [lo, hi) with 53 random bits.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// A uniform integer in [0, n) (n = 0 is treated as 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A Fisher–Yates permutation of 0..n.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
        v
    }

    /// A permutation of the rows `0..group_ids.len()` that keeps each group's rows together:
    /// the groups in a Fisher–Yates order, each group's rows in ascending order. Mini- and
    /// micro-batches cut from it hold whole groups, so rows that share a prompt are scored
    /// together (the shared-prefix pass of `ember-llm` runs each prompt once per micro-batch).
    pub fn group_permutation(&mut self, group_ids: &[usize]) -> Vec<usize> {
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for (row, g) in group_ids.iter().enumerate() {
            match groups.iter_mut().find(|(id, _)| id == g) {
                Some((_, rows)) => rows.push(row),
                None => groups.push((*g, vec![row])),
            }
        }
        self.permutation(groups.len())
            .into_iter()
            .flat_map(|k| groups[k].1.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    /// Through rand's traits it draws its own stream: the first two outputs from state 0 are
    /// those of Vigna's `splitmix64.c` (0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4); bytes are those
    /// words little-endian; rand's own algorithms take it.
    #[test]
    fn rand_takes_it_as_a_generator() {
        use rand::seq::SliceRandom;
        use rand_core::{Rng, SeedableRng};
        let mut a = SplitMix64(0);
        assert_eq!(Rng::next_u64(&mut a), 0xE220_A839_7B1D_CDAF);
        assert_eq!(Rng::next_u64(&mut a), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(Rng::next_u32(&mut SplitMix64(0)), 0xE220_A839);
        let mut b = SplitMix64::from_seed(0u64.to_le_bytes());
        let mut bytes = [0u8; 12];
        Rng::fill_bytes(&mut b, &mut bytes);
        assert_eq!(bytes[..8], 0xE220_A839_7B1D_CDAF_u64.to_le_bytes());
        assert_eq!(bytes[8..], 0x6E78_9E6A_A1B9_65F4_u64.to_le_bytes()[..4]);
        let mut v: Vec<u32> = (0..10).collect();
        v.shuffle(&mut SplitMix64(3));
        let mut sorted = v.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_ne!(v, sorted);
    }

    #[test]
    fn group_permutation_keeps_groups_whole() {
        let ids = [7, 3, 7, 9, 3, 7, 9, 1];
        let mut rng = SplitMix64(5);
        let p = rng.group_permutation(&ids);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..8).collect::<Vec<_>>(), "a permutation");
        // Each group's rows are contiguous and ascending.
        for g in [7, 3, 9, 1] {
            let at: Vec<usize> = (0..8).filter(|i| ids[p[*i]] == g).collect();
            assert!(
                at.windows(2).all(|w| w[1] == w[0] + 1),
                "group {g} split: {p:?}"
            );
            assert!(at.windows(2).all(|w| p[w[0]] < p[w[1]]));
        }
        // Seeds give different group orders.
        let orders: std::collections::BTreeSet<Vec<usize>> = (0..8)
            .map(|s| SplitMix64(s).group_permutation(&ids))
            .collect();
        assert!(orders.len() > 1);
    }
}
