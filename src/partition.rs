//! Partitions: how admins that share one database share its schedule.
//!
//! The space of jobs (and of workflows) is cut into [`PARTITIONS`] partitions by id
//! ([`of`], which spreads consecutive ids over the partitions). An admin fires only the jobs of
//! the partitions it holds, under a lease with an owner, a fence and an expiry that it renews
//! every beat; a partition is taken over only once it is free, its lease ran out or its holder
//! is known dead, and every take bumps its fence.
//!
//! This module decides, purely, what an admin does with the partitions at each beat ([`plan`]):
//! from the live admins and each partition's lease, how many partitions are its fair share
//! (each of N live admins about 1/N, the same answer on every admin), which partitions it
//! takes (free ones up to its share, and its part of a dead admin's; expired ones whatever the
//! share), which it gives back when it holds more, and when to look again because a lease it
//! waits for runs out.
//!
//! It does no IO and reads no clock: storage keeps the leases (`storage::partitions`), the
//! admin's loop (`admin::partitions`) beats, and the scheduler's fire checks its lease in the
//! transaction that commits the fire.
#![warn(missing_docs)]

use std::collections::BTreeMap;

/// How many partitions the job space is cut into; fixed for the life of a database.
pub const PARTITIONS: u16 = 256;

/// What an id is multiplied by before it is cut to a partition: odd, so ids map onto every
/// partition alike, and large, so consecutive ids (a small deployment's jobs 1 to 20) land in
/// partitions far apart, which different admins hold.
pub const SPREAD: i64 = 167;

/// The partition of the job or workflow `id`: `(id × SPREAD) mod PARTITIONS`, as storage's
/// filters compute it in SQL.
pub fn of(id: i64) -> u16 {
    let partitions = i64::from(PARTITIONS);
    u16::try_from((id.rem_euclid(partitions) * SPREAD).rem_euclid(partitions)).unwrap_or(0)
}

/// The partitions one admin holds, each with the fence of its lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The admin's lease owner id.
    pub owner: String,
    /// Partition → the fence its lease was taken with.
    pub fences: BTreeMap<u16, i64>,
}

impl Held {
    /// Nothing held: an admin that fires nothing.
    pub fn none(owner: &str) -> Held {
        Held { owner: owner.to_owned(), fences: BTreeMap::new() }
    }

    /// Every partition, with fence 0: a filter that keeps every row (a test's, or a read that
    /// covers the whole schedule), not a lease a fire commits under.
    pub fn everything(owner: &str) -> Held {
        Held { owner: owner.to_owned(), fences: (0..PARTITIONS).map(|id| (id, 0)).collect() }
    }

    /// Whether no partition is held.
    pub fn is_empty(&self) -> bool {
        self.fences.is_empty()
    }

    /// How many partitions are held.
    pub fn len(&self) -> usize {
        self.fences.len()
    }

    /// Whether every partition is held (an admin alone: no filter needed).
    pub fn is_all(&self) -> bool {
        self.fences.len() == usize::from(PARTITIONS)
    }

    /// Whether the job or workflow `id` is in a held partition.
    pub fn covers(&self, id: i64) -> bool {
        self.fences.contains_key(&of(id))
    }

    /// Whether `partition` is held with `fence`.
    pub fn holds(&self, partition: u16, fence: i64) -> bool {
        self.fences.get(&partition) == Some(&fence)
    }
}

/// One partition's lease as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The partition.
    pub partition: u16,
    /// Its holder, if any.
    pub owner: Option<String>,
    /// Bumped at every take.
    pub fence: i64,
    /// When the lease runs out unless renewed, in ms since the epoch.
    pub until_ms: i64,
}

impl Lease {
    /// Whether another admin may take it at `now_ms`: nobody holds it, or its lease ran out.
    pub fn is_free(&self, now_ms: i64) -> bool {
        self.owner.is_none() || self.until_ms < now_ms
    }
}

/// What an admin does with the partitions at one beat.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Its fair share: how many partitions it should hold.
    pub share: usize,
    /// Free or expired partitions to take, lowest first.
    pub take: Vec<u16>,
    /// Held partitions to give back, highest first.
    pub release: Vec<u16>,
    /// When the first of the other admins' leases runs out: the beat to look again at, so
    /// that a dead admin's partitions are taken when their lease ends, not a beat later.
    pub look_again_at: Option<i64>,
}

/// Decides `me`'s beat: `live` are the admins seen within the lease (`me` among them or not),
/// `predecessors` the admins known dead (the earlier incarnations of `me`, the same host and
/// listen address, dead since `me` holds their port; and the admins whose database session
/// ended), and `leases` every partition's lease after `me` renewed its own.
///
/// Shares: the live admins sorted by id, each gets `PARTITIONS / n`, and the first
/// `PARTITIONS % n` one more; every admin computes the same shares from the same list, so an
/// admin above its share gives back what another below it takes. A dead admin's partitions are
/// taken at once, not when its lease runs out: each live admin takes, in their order, what its
/// share lacks, so the dead admin's partitions are shared out by the live admins' next beats
/// without a second handover. Partitions whose lease ran out (a dead admin's, while other dead
/// or paused admins still count as live) are taken whatever the share, as their jobs would
/// otherwise wait; an admin above its share after that gives the excess back at its next beat.
pub fn plan(
    me: &str,
    now_ms: i64,
    live: &[String],
    predecessors: &[String],
    leases: &[Lease],
) -> Plan {
    let mut members: Vec<&str> = live
        .iter()
        .map(String::as_str)
        .filter(|member| !predecessors.iter().any(|dead| dead == member))
        .collect();
    members.push(me);
    members.sort_unstable();
    members.dedup();
    let count = members.len();
    let index = members.iter().position(|member| *member == me).unwrap_or(0);
    let total = usize::from(PARTITIONS);
    let share = total / count + usize::from(index < total % count);
    let held_by =
        |member: &str| leases.iter().filter(|lease| lease.owner.as_deref() == Some(member)).count();
    let mine = held_by(me);
    let of_the_dead = |lease: &Lease| {
        lease
            .owner
            .as_deref()
            .is_some_and(|owner| owner != me && predecessors.iter().any(|dead| dead == owner))
    };
    let expired = |lease: &Lease| {
        lease.owner.as_deref().is_some_and(|owner| owner != me && lease.until_ms < now_ms)
    };
    let orphaned = |lease: &&Lease| of_the_dead(lease) || expired(lease);
    let mut plan = Plan { share, ..Plan::default() };
    // Expired leases of admins not known dead: whatever the share.
    plan.take = leases
        .iter()
        .filter(|lease| expired(lease) && !of_the_dead(lease))
        .map(|lease| lease.partition)
        .collect();
    // The dead admins' partitions: shared out among the live admins in their order, each taking
    // up to its share, so that each of them takes its part at its own next beat and none is
    // handed on a second time; what is left over (shares already met) goes to the first.
    let dead: Vec<u16> =
        leases.iter().filter(|lease| of_the_dead(lease)).map(|lease| lease.partition).collect();
    let mut next = 0;
    for (position, member) in members.iter().enumerate() {
        let member_share = total / count + usize::from(position < total % count);
        let part = member_share.saturating_sub(held_by(member)).min(dead.len() - next);
        if *member == me {
            plan.take.extend(&dead[next..next + part]);
        }
        next += part;
    }
    if index == 0 {
        plan.take.extend(&dead[next..]);
    }
    let wanted = share.saturating_sub(mine + plan.take.len());
    let mut free: Vec<u16> =
        leases.iter().filter(|lease| lease.owner.is_none()).map(|lease| lease.partition).collect();
    free.truncate(wanted);
    plan.take.extend(free);
    plan.take.sort_unstable();
    if mine > share {
        let mut release: Vec<u16> = leases
            .iter()
            .filter(|lease| lease.owner.as_deref() == Some(me))
            .map(|lease| lease.partition)
            .collect();
        release.sort_unstable_by(|a, b| b.cmp(a));
        release.truncate(mine - share);
        plan.release = release;
    }
    // Another admin's lease that runs out is a partition to take if its admin died (a live
    // admin renews long before): look again right then, not a beat later.
    plan.look_again_at = leases
        .iter()
        .filter(|lease| lease.owner.as_deref() != Some(me) && !lease.is_free(now_ms))
        .filter(|lease| !orphaned(lease))
        .map(|lease| lease.until_ms + 1)
        .min();
    plan
}

#[cfg(test)]
mod tests;
