//! CONSISTENT_HASH: XXL-JOB's `ExecutorRouteConsistentHash`, bit for bit.
//!
//! Every address gets [`VIRTUAL_NODE_NUM`] points on a 32-bit ring, the job id gets one, and the
//! job goes to the first point at or after its own, wrapping to the lowest point. The hash is the
//! little-endian first four bytes of an MD5 digest, as XXL-JOB computes it, so a job lands on the
//! same executor here as it would under XXL-JOB for the same addresses. The ring is rebuilt on
//! every call like XXL-JOB does; it does not cache it, because groups are small and change.
//!
//! The address hashed is the one an XXL-JOB executor registers, `http://ip:port/`, with its
//! trailing slash. Our admin stores addresses without it, so the slash is put back before
//! hashing; an executor whose configured address has a path is hashed the same way, with one
//! slash at its end.

use md5::{Digest, Md5};

/// How many points each address gets on the ring (XXL-JOB's `VIRTUAL_NODE_NUM`).
const VIRTUAL_NODE_NUM: u32 = 100;

/// XXL-JOB's `hash(key)`: the first four bytes of the MD5 digest of the UTF-8 bytes, read
/// little-endian as an unsigned 32-bit value.
fn hash(key: &str) -> u32 {
    let digest: [u8; 16] = Md5::digest(key.as_bytes()).into();
    u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// The address `job_id` lands on, or None when `addresses` is empty.
pub(super) fn pick(job_id: i64, addresses: &[String]) -> Option<&String> {
    // Java's `String.valueOf(int)` and Rust's `to_string` spell integers the same way.
    let job_hash = hash(&job_id.to_string());
    // XXL-JOB puts every point into a TreeMap and then asks for the ceiling of the job's hash.
    // Scanning for the smallest point at or above it (and the smallest point overall, for the
    // wrap-around) gives the same answer without building the map. On equal hashes a later
    // `put` replaces an earlier one, so ties go to the point inserted last: hence `<=`.
    let mut ceiling: Option<(u32, &String)> = None;
    let mut lowest: Option<(u32, &String)> = None;
    for address in addresses {
        let registered = format!("{}/", address.trim_end_matches('/'));
        for node in 0..VIRTUAL_NODE_NUM {
            let point = hash(&format!("SHARD-{registered}-NODE-{node}"));
            if point >= job_hash && ceiling.is_none_or(|(best, _)| point <= best) {
                ceiling = Some((point, address));
            }
            if lowest.is_none_or(|(best, _)| point <= best) {
                lowest = Some((point, address));
            }
        }
    }
    ceiling.or(lowest).map(|(_, address)| address)
}
