//! Kafka's default partitioner for keyed messages, bit for bit.
//!
//! The Java client (and librdkafka's `murmur2_random`) map a key to
//! `toPositive(murmur2(key)) % partitions`, with `murmur2` as in `org.apache.kafka.common.utils
//! .Utils`. Partition affinity is a cross-client contract — a run's messages written by a Java,
//! Go or Rust producer must land on the same partition — so agreeing with Kafka exactly is the
//! whole requirement; a hash that is merely self-consistent would silently break it.

/// Kafka's `Utils.murmur2`: MurmurHash2, 32-bit, seed `0x9747b28c`, as a Java `int`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java computes `seed ^ length` on an `int`; lengths past 2^32 are not messages.
    let mut h: u32 = SEED ^ (data.len() as u32);

    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }

    // The Java `switch` falls through from 3 to 2 to 1; the multiply ends case 1.
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }

    // `>>>` in Java is the logical shift, which `>>` on u32 is.
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    i32::from_ne_bytes(h.to_ne_bytes())
}

/// Kafka's `Utils.toPositive`: clears the sign bit (not `abs`, which is undefined at `i32::MIN`
/// and maps some keys elsewhere).
pub fn to_positive(n: i32) -> u32 {
    u32::from_ne_bytes(n.to_ne_bytes()) & 0x7fff_ffff
}

/// The partition of a keyed message among `partitions`, as Kafka's default partitioner picks it.
///
/// # Panics
///
/// If `partitions` is zero; every topic has at least one partition.
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    to_positive(murmur2(key)) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of Kafka's own `UtilsTest.testMurmur2`.
    #[test]
    fn murmur2_matches_kafka() {
        let vectors: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ];
        for (key, expected) in vectors {
            assert_eq!(murmur2(key.as_bytes()), expected, "murmur2({key:?})");
        }
    }

    #[test]
    fn every_tail_length_is_hashed() {
        // Lengths 0..=7 cover every tail (0, 1, 2, 3 bytes) with and without a full block; a
        // tail byte that was ignored would make two of these collide.
        let hashes: Vec<i32> = (0..8).map(|n| murmur2(&b"abcdefgh"[..n])).collect();
        for (i, a) in hashes.iter().enumerate() {
            for b in &hashes[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // "abc" is a 3-byte tail only; "21" a 2-byte tail; Kafka's values pin both above.
        assert_ne!(murmur2(b"ab"), murmur2(b"ac"));
        assert_ne!(murmur2(b"abcd\x01"), murmur2(b"abcd\x02"));
    }

    #[test]
    fn to_positive_masks_the_sign_bit() {
        assert_eq!(to_positive(-973_932_308), 1_173_551_340);
        assert_eq!(to_positive(i32::MIN), 0);
        assert_eq!(to_positive(-1), 0x7fff_ffff);
        assert_eq!(to_positive(479_470_107), 479_470_107);
    }

    #[test]
    fn partitions_follow_the_masked_hash() {
        // (-973932308 & 0x7fffffff) = 1173551340 = 8 * 146693917 + 4
        assert_eq!(partition_for(b"21", 8), 4);
        assert_eq!(partition_for(b"21", 1), 0);
        // 479470107 = 3 * 159823369 and = 8 * 59933763 + 3
        assert_eq!(partition_for(b"abc", 3), 0);
        assert_eq!(partition_for(b"abc", 8), 3);
        for key in ["r-abc", "r-1", "r-2", "foobar"] {
            for n in [1, 2, 3, 8, 12, 64] {
                let p = partition_for(key.as_bytes(), n);
                assert!(p < n);
                assert_eq!(p, to_positive(murmur2(key.as_bytes())) % n);
            }
        }
    }

    #[test]
    #[should_panic(expected = "at least one partition")]
    fn zero_partitions_is_a_bug() {
        let _ = partition_for(b"r-1", 0);
    }
}
