//! The journal's memory of accepted runs: for each `logId` accepted within the window, its state
//! and a fingerprint of the job and fire time it was accepted for, in a few bytes per run.
//!
//! At 10,000 runs a second an hour's window holds 36 million runs; a hash map of full entries
//! cost gigabytes. Here the runs accepted lately sit in a small hash map (`fresh`, at most
//! [`BLOCK_RUNS`] runs or [`BLOCK_MS`] of acceptances); it is then sealed into a block: the run
//! ids sorted in one array and their tags (fingerprint and state, 32 bits) in another, 12 bytes
//! a run. A lookup asks the fresh map, then the blocks whose id range holds the id (run ids
//! grow, so that is one or two blocks), by binary search. A block goes once its newest
//! acceptance is older than the window; its runs still queued or running move to `lingering`
//! and are dropped there when they end, so a live run stays known however old.
//!
//! It does no IO and keeps no clock: times come in as arguments. It knows nothing of files.

use std::collections::{HashMap, VecDeque};

use super::RunState;

/// The most runs the fresh map holds before it is sealed into a block.
pub(super) const BLOCK_RUNS: usize = 65_536;

/// The longest span of acceptances the fresh map holds before it is sealed, so that a block
/// leaves the window soon after its runs do.
pub(super) const BLOCK_MS: i64 = 60_000;

/// A run's tag: its fingerprint in the high 30 bits, its state in the low 2.
type Tag = u32;

const STATE_BITS: u32 = 2;
const STATE_MASK: Tag = 0b11;

/// A 30-bit fingerprint of the job and fire time a run was accepted for. Two different pairs
/// share one with a chance of one in a billion, and then a mismatch goes unnoticed.
pub(super) fn fingerprint(job_id: i64, fire_ms: Option<i64>) -> u32 {
    // splitmix64's finalizer over both values: stable across processes and releases, since
    // the journal's lines are replayed by later ones.
    let mut x = (job_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ fire_ms.map_or(0x5851_F42D_4C95_7F2D, |fire| fire as u64).rotate_left(29);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 34) as u32
}

fn tag(fingerprint: u32, state: RunState) -> Tag {
    let state = match state {
        RunState::Queued => 0,
        RunState::Running => 1,
        RunState::Reported => 2,
        RunState::Lost => 3,
    };
    (fingerprint << STATE_BITS) | state
}

fn state_of(tag: Tag) -> RunState {
    match tag & STATE_MASK {
        0 => RunState::Queued,
        1 => RunState::Running,
        2 => RunState::Reported,
        _ => RunState::Lost,
    }
}

fn with_state(tag: Tag, state: RunState) -> Tag {
    (tag & !STATE_MASK) | (self::tag(0, state) & STATE_MASK)
}

/// What the index knows of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Known {
    /// Where the run is.
    pub(super) state: RunState,
    /// The fingerprint of the job and fire time it was accepted for.
    pub(super) fingerprint: u32,
}

/// Sealed acceptances: ids sorted, tags in the same order.
struct Block {
    ids: Box<[i64]>,
    tags: Box<[Tag]>,
    newest_ms: i64,
}

impl Block {
    fn position(&self, log_id: i64) -> Option<usize> {
        let (first, last) = (self.ids.first()?, self.ids.last()?);
        if log_id < *first || log_id > *last {
            return None;
        }
        self.ids.binary_search(&log_id).ok()
    }
}

/// The accepted runs of the window (and older ones still live).
#[derive(Default)]
pub(super) struct Index {
    fresh: HashMap<i64, Tag>,
    /// When the fresh map's oldest and newest acceptances were.
    fresh_span: Option<(i64, i64)>,
    blocks: VecDeque<Block>,
    lingering: HashMap<i64, Tag>,
}

impl Index {
    /// What is known of `log_id`.
    pub(super) fn get(&self, log_id: i64) -> Option<Known> {
        let tag =
            self.fresh.get(&log_id).or_else(|| self.lingering.get(&log_id)).copied().or_else(
                || {
                    self.blocks.iter().rev().find_map(|block| {
                        block.position(log_id).and_then(|at| block.tags.get(at).copied())
                    })
                },
            )?;
        Some(Known { state: state_of(tag), fingerprint: tag >> STATE_BITS })
    }

    /// Records `log_id`, not known yet, as accepted at `at_ms` in `state`.
    pub(super) fn insert(&mut self, log_id: i64, fingerprint: u32, state: RunState, at_ms: i64) {
        if let Some((oldest, _)) = self.fresh_span
            && (self.fresh.len() >= BLOCK_RUNS || at_ms.saturating_sub(oldest) > BLOCK_MS)
        {
            self.seal();
        }
        self.fresh.insert(log_id, tag(fingerprint, state));
        self.fresh_span = Some(match self.fresh_span {
            Some((oldest, newest)) => (oldest.min(at_ms), newest.max(at_ms)),
            None => (at_ms, at_ms),
        });
    }

    /// Sets the state of `log_id`, if known; whether it was.
    pub(super) fn set(&mut self, log_id: i64, state: RunState) -> bool {
        if let Some(tag) = self.fresh.get_mut(&log_id).or_else(|| self.lingering.get_mut(&log_id)) {
            *tag = with_state(*tag, state);
            return true;
        }
        for block in self.blocks.iter_mut().rev() {
            if let Some(tag) = block.position(log_id).and_then(|at| block.tags.get_mut(at)) {
                *tag = with_state(*tag, state);
                return true;
            }
        }
        false
    }

    /// Drops `log_id` if it outlived its block (it was accepted before the window and has just
    /// ended).
    pub(super) fn forget_lingering(&mut self, log_id: i64) {
        self.lingering.remove(&log_id);
    }

    /// Drops the blocks whose every acceptance is before `cutoff_ms`, keeping their live runs.
    pub(super) fn forget_before(&mut self, cutoff_ms: i64) {
        if self.fresh_span.is_some_and(|(_, newest)| newest < cutoff_ms) {
            self.seal();
        }
        while self.blocks.front().is_some_and(|block| block.newest_ms < cutoff_ms) {
            let Some(block) = self.blocks.pop_front() else { break };
            for (id, tag) in block.ids.iter().zip(block.tags.iter()) {
                if matches!(state_of(*tag), RunState::Queued | RunState::Running) {
                    self.lingering.insert(*id, *tag);
                }
            }
        }
    }

    /// How many runs it knows.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.fresh.len()
            + self.lingering.len()
            + self.blocks.iter().map(|block| block.ids.len()).sum::<usize>()
    }

    /// The heap bytes it holds, computed from its capacities (a hash map as hashbrown lays it
    /// out: a power of two of buckets for its capacity at 7/8 load, each an entry and a control
    /// byte).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        let map = |map: &HashMap<i64, Tag>| {
            if map.capacity() == 0 {
                return 0;
            }
            let buckets = (map.capacity() * 8 / 7).next_power_of_two();
            buckets * (size_of::<(i64, Tag)>() + 1)
        };
        let blocks: usize = self
            .blocks
            .iter()
            .map(|block| {
                size_of::<Block>()
                    + block.ids.len() * size_of::<i64>()
                    + block.tags.len() * size_of::<Tag>()
            })
            .sum();
        map(&self.fresh) + map(&self.lingering) + blocks
    }

    /// Moves the fresh map into a block.
    fn seal(&mut self) {
        let Some((_, newest_ms)) = self.fresh_span.take() else { return };
        let mut runs: Vec<(i64, Tag)> = self.fresh.drain().collect();
        runs.sort_unstable_by_key(|(id, _)| *id);
        let (ids, tags): (Vec<i64>, Vec<Tag>) = runs.into_iter().unzip();
        self.blocks.push_back(Block {
            ids: ids.into_boxed_slice(),
            tags: tags.into_boxed_slice(),
            newest_ms,
        });
        if self.fresh.capacity() > 2 * BLOCK_RUNS {
            self.fresh.shrink_to(BLOCK_RUNS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_fingerprints_survive_sealing_and_lookups_find_every_run() {
        let mut index = Index::default();
        let at = 1_000_000;
        // Ids out of order across blocks, as runs of several admins' sends arrive.
        let ids: Vec<i64> = (0..200_000).map(|n| (n * 7_919) % 200_003 + 1).collect();
        for (n, id) in ids.iter().enumerate() {
            index.insert(*id, fingerprint(*id % 13, Some(*id)), RunState::Queued, at);
            if n % 3 == 0 {
                assert!(index.set(*id, RunState::Reported));
            }
        }
        assert!(index.blocks.len() >= 3, "sealed by size");
        for (n, id) in ids.iter().enumerate() {
            let known = index.get(*id).unwrap();
            let state = if n % 3 == 0 { RunState::Reported } else { RunState::Queued };
            assert_eq!(known, Known { state, fingerprint: fingerprint(*id % 13, Some(*id)) });
        }
        assert_eq!(index.get(200_004), None);
        assert_eq!(index.len(), 200_000);
        assert!(index.set(ids[1], RunState::Lost));
        assert_eq!(index.get(ids[1]).unwrap().state, RunState::Lost);
    }

    #[test]
    fn blocks_leave_after_the_window_and_their_live_runs_linger_until_they_end() {
        let mut index = Index::default();
        index.insert(1, 5, RunState::Reported, 0);
        index.insert(2, 5, RunState::Running, 10);
        index.insert(3, 5, RunState::Queued, BLOCK_MS + 11); // Seals {1, 2}.
        index.forget_before(BLOCK_MS + 11);
        assert_eq!(index.get(1), None);
        assert_eq!(index.get(2).map(|known| known.state), Some(RunState::Running));
        assert_eq!(index.len(), 2, "run 2 lingers, run 3 is fresh");
        index.forget_lingering(2);
        assert_eq!(index.get(2), None);
        assert_eq!(index.get(3).map(|known| known.state), Some(RunState::Queued));
    }

    /// An hour of 10,000 runs a second, each accepted and ended, by the injected clock: the
    /// index holds all 36 million (the window) in at most 16 bytes a run.
    #[test]
    fn an_hour_at_ten_thousand_runs_a_second_fits_in_sixteen_bytes_a_run() {
        const RUNS: i64 = 36_000_000;
        let start = 1_764_000_000_000;
        let mut index = Index::default();
        for n in 0..RUNS {
            let now = start + n / 10; // Ten runs a millisecond.
            let log_id = n + 1;
            // Each run ended: its state changes in place, so it is stored as ended.
            index.insert(log_id, fingerprint(log_id % 2_000, Some(now)), RunState::Reported, now);
            if n % 100_000 == 0 {
                index.forget_before(now - 3_600_000);
            }
        }
        assert_eq!(index.len(), 36_000_000, "the whole window is remembered");
        let end = start + RUNS / 10;
        let first = index.get(1).unwrap();
        let expected =
            Known { state: RunState::Reported, fingerprint: fingerprint(1, Some(start)) };
        assert_eq!(first, expected);
        let bytes = index.bytes();
        let per_run = bytes as f64 / RUNS as f64;
        eprintln!("journal index: {bytes} bytes for {RUNS} runs, {per_run:.2} bytes a run");
        assert!(bytes <= 16 * 36_000_000, "{per_run:.2} bytes a run");
        // An hour later the window has moved past them all.
        index.forget_before(end + 3_600_000);
        assert_eq!((index.len(), index.get(1)), (0, None));
    }
}
