//! Kafka-compatible partitioning: `murmur2(key) & 0x7fffffff % partitions`, exactly as
//! Kafka's default partitioner, so any Kafka client keying by aggregate id agrees with us.

/// Kafka's murmur2 hash (`org.apache.kafka.common.utils.Utils.murmur2`).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions` (Kafka's `toPositive(murmur2(key)) % n`).
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "partition count must be positive");
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors from Kafka's `UtilsTest.testMurmur2`.
    #[test]
    fn matches_kafka_vectors() {
        let cases: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            ("abc", 479_470_107),
        ];
        for (input, want) in cases {
            assert_eq!(murmur2(input.as_bytes()), want, "murmur2({input:?})");
        }
    }

    #[test]
    fn partitions_are_in_range_and_spread() {
        let mut seen = [0u32; 8];
        for i in 0..8000 {
            let p = partition_for(format!("order-{i}").as_bytes(), 8);
            seen[p as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 700), "{seen:?}");
    }
}
