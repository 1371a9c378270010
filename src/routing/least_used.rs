//! LEAST_FREQUENTLY_USED and LEAST_RECENTLY_USED: the per-job bookkeeping of XXL-JOB's
//! `ExecutorRouteLFU` and `ExecutorRouteLRU`.
//!
//! Each function works on one job's entry; expiring the whole cache every 24 hours is the
//! caller's business (see `JobCache` in the parent module).

use std::collections::{HashMap, HashSet, VecDeque};

use rand::{Rng, RngCore};

use super::COUNT_RESET_ABOVE;

/// One job's use counts per address (XXL-JOB's `lfuItemMap`).
pub(super) type UseCounts = HashMap<String, usize>;

/// One job's addresses, least recently used first (XXL-JOB's access-ordered `LinkedHashMap`).
pub(super) type UseOrder = VecDeque<String>;

/// Picks the address with the smallest use count and counts this use.
///
/// Addresses it has not seen, and those whose count passed [`COUNT_RESET_ABOVE`], start at a
/// random count below the number of addresses, so that a fresh job does not send its first
/// triggers to the first address. The random draws happen in list order, as in XXL-JOB.
/// Ties go to the address that comes first in `addresses`: XXL-JOB breaks them by a stable sort
/// over a `HashMap`'s iteration order, which is arbitrary and cannot be reproduced, so the list
/// order is the deterministic stand-in.
pub(super) fn least_frequently_used(
    counts: &mut UseCounts,
    addresses: &[String],
    rng: &mut dyn RngCore,
) -> Option<String> {
    for address in addresses {
        if counts.get(address).is_none_or(|&count| count > COUNT_RESET_ABOVE) {
            counts.insert(address.clone(), rng.random_range(0..addresses.len()));
        }
    }
    let present: HashSet<&str> = addresses.iter().map(String::as_str).collect();
    counts.retain(|address, _| present.contains(address.as_str()));
    // `min_by_key` returns the first of equal minimums, which is the tie rule documented above.
    let chosen = addresses
        .iter()
        .min_by_key(|address| counts.get(*address).copied().unwrap_or(usize::MAX))?;
    if let Some(count) = counts.get_mut(chosen) {
        *count += 1;
    }
    Some(chosen.clone())
}

/// Picks the address used least recently and marks it as just used.
///
/// Addresses it has not seen join at the most recent end in list order, and addresses no longer
/// online are forgotten, which is what XXL-JOB's `put` then `remove` on its `LinkedHashMap` does.
pub(super) fn least_recently_used(order: &mut UseOrder, addresses: &[String]) -> Option<String> {
    for address in addresses {
        if !order.contains(address) {
            order.push_back(address.clone());
        }
    }
    let present: HashSet<&str> = addresses.iter().map(String::as_str).collect();
    order.retain(|address| present.contains(address.as_str()));
    let eldest = order.pop_front()?;
    order.push_back(eldest.clone());
    Some(eldest)
}
