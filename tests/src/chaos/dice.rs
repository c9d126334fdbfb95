//! Seeded dice that do not depend on the order things happen in.
//!
//! A fault is drawn from the seed and the identity of what it befalls (the endpoint, the
//! idempotency key, the how-many-th request for that key), never from a shared generator
//! advanced in arrival order: two runs with one seed then give each request the same fault
//! however the pipeline's threads interleave, which is what makes a failing seed replayable.

/// A value in [0, 1) drawn from `seed` and `parts`.
pub fn unit(seed: u64, parts: &[&str]) -> f64 {
    // The top 53 bits: every such value is exactly representable as an f64.
    (hash(seed, parts) >> 11) as f64 / (1u64 << 53) as f64
}

/// A value in `low..=high` drawn from `seed` and `parts`.
pub fn between(seed: u64, parts: &[&str], low: u64, high: u64) -> u64 {
    if high <= low {
        return low;
    }
    low + hash(seed, parts) % (high - low + 1)
}

/// A stable 64-bit hash of `seed` and `parts`: FNV-1a over the bytes (each part followed by a
/// separator, so `["ab", "c"]` and `["a", "bc"]` differ), finished with splitmix64 so nearby
/// inputs give unrelated outputs.
pub fn hash(seed: u64, parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ splitmix(seed);
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    splitmix(h)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_stable_and_spread() {
        assert_eq!(hash(7, &["a", "b"]), hash(7, &["a", "b"]));
        assert_ne!(hash(7, &["ab"]), hash(7, &["a", "b"]));
        assert_ne!(hash(7, &["a"]), hash(8, &["a"]));
        let n = 20_000;
        let below_tenth = (0..n)
            .filter(|i| unit(42, &["k", &i.to_string()]) < 0.1)
            .count();
        // 10% of 20,000 is 2,000; the binomial's standard deviation is about 42.
        assert!((1_800..2_200).contains(&below_tenth), "{below_tenth}");
        for i in 0..1_000 {
            let v = between(1, &[&i.to_string()], 5, 9);
            assert!((5..=9).contains(&v));
        }
    }
}
