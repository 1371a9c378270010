//! What this admin knows of each executor's protocol: a wasmjob executor, or an XXL-JOB executor
//! of which generation, learned from its registration.
//!
//! A wasmjob executor lists the runs it holds (`heldRuns`) in every beat; an XXL-JOB executor
//! never does. Of those, a 3.5 executor names its application in `XXL-JOB-APPNAME` when it
//! registers (and refuses calls that do not name it back), while 2.2 to 3.4 executors send the
//! access token alone. The answer decides the trigger route (`/run` or `/trigger`), whether calls
//! carry `XXL-JOB-APPNAME`, and what a kill means: a wasmjob executor stops the one run named by
//! `logId`, an XXL-JOB executor stops the job's whole thread and queue.
//!
//! The answer is stored with the registration (`registry.peer_kind`), so every admin of the
//! database knows it from the first call: after a restart, and for an executor that beats to
//! another admin. This admin keeps what it read in memory: what an executor's registration here
//! says at once, and what the database says for `PEER_TTL_MS`, so that sends cost at most one
//! query per address in that time: the sends that find it expired together read it once, the
//! others going on with what was known. An
//! address with no registration (a `MANUAL` group's) or one registered before the kind was
//! stored is unknown: it is spoken to as a classic executor (`/run`), and a kill on it says
//! that it may stop the job's whole queue.
//!
//! The sender reads the memory without waiting (`Peers::get`); `Dispatcher::peer` is the read
//! that refreshes it, and the dispatcher calls it before every send.

use foldhash::HashMap;
use std::sync::{Arc, Mutex};

use super::Dispatcher;
use crate::admin::now_ms;
use crate::protocol::{Generation, REGISTRY_GROUP_EXECUTOR};

/// How long what the database said of an address is used before it is read again. A
/// registration through this admin is known at once; one through another admin of the same
/// database, within this long.
const PEER_TTL_MS: i64 = 5_000;
/// The most addresses remembered before the memory starts over.
const MAX_REMEMBERED: usize = 10_000;

/// Which software answers at an executor address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerKind {
    /// A wasmjob executor: it kills single runs and reports the runs it holds.
    Wasmjob,
    /// An XXL-JOB executor of this generation.
    XxlJob(Generation),
}

impl PeerKind {
    /// How the kind is stored with the registration.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerKind::Wasmjob => "wasmjob",
            PeerKind::XxlJob(Generation::Classic) => "xxl-job",
            PeerKind::XxlJob(Generation::V3_5) => "xxl-job-3.5",
        }
    }

    /// The kind stored as `text`; `None` for anything else (an empty column: not known).
    pub fn parse(text: &str) -> Option<PeerKind> {
        match text {
            "wasmjob" => Some(PeerKind::Wasmjob),
            "xxl-job" => Some(PeerKind::XxlJob(Generation::Classic)),
            "xxl-job-3.5" => Some(PeerKind::XxlJob(Generation::V3_5)),
            _ => None,
        }
    }
}

/// One registered executor, as its last registration described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// What answers there.
    pub kind: PeerKind,
    /// The application it registered for (shared: a run's send asks for its peer four times).
    pub app_name: Arc<str>,
    /// A wasmjob executor that holds a trigger sent with `notBefore` until its instant, so its
    /// scheduled runs may be sent ahead (`Dispatcher::send_created_at`).
    pub holds_triggers: bool,
}

/// How a wasmjob executor that holds early triggers is stored: a kind of its own, which an
/// admin that does not know it reads as unknown, and so never sends it a run ahead of time.
const WASMJOB_HOLDING: &str = "wasmjob+holds";

impl Peer {
    /// The peer a registration describes: whether it listed held runs, whether it named its
    /// application in `XXL-JOB-APPNAME`, and whether it said it holds early triggers.
    pub fn from_registration(
        app_name: &str,
        lists_held_runs: bool,
        names_app: bool,
        holds_triggers: bool,
    ) -> Peer {
        // A wasmjob executor holding too many runs to list them says what it is by
        // `holdsTriggers` alone.
        let kind = match (lists_held_runs || holds_triggers, names_app) {
            (true, _) => PeerKind::Wasmjob,
            (false, true) => PeerKind::XxlJob(Generation::V3_5),
            (false, false) => PeerKind::XxlJob(Generation::Classic),
        };
        let holds_triggers = holds_triggers && kind == PeerKind::Wasmjob;
        Peer { kind, app_name: app_name.into(), holds_triggers }
    }

    /// How the peer is stored with its registration.
    pub fn stored_kind(&self) -> &'static str {
        if self.holds_triggers { WASMJOB_HOLDING } else { self.kind.as_str() }
    }

    /// The peer stored as `kind` for `app_name`; `None` for a kind not known.
    pub fn from_stored(kind: &str, app_name: String) -> Option<Peer> {
        let (kind, holds_triggers) = match kind {
            WASMJOB_HOLDING => (PeerKind::Wasmjob, true),
            _ => (PeerKind::parse(kind)?, false),
        };
        Some(Peer { kind, app_name: app_name.into(), holds_triggers })
    }

    /// What an operator is shown for a stored kind: `wasmjob`, `xxl-job` (XXL-JOB 2.2 to 3.4) or
    /// `xxl-job-3.5`; `None` when it is not known (a row older than the column).
    pub fn shown_kind(stored: &str) -> Option<&'static str> {
        Peer::from_stored(stored, String::new()).map(|peer| peer.kind.as_str())
    }

    /// The generation to speak to it.
    pub fn generation(&self) -> Generation {
        match self.kind {
            PeerKind::Wasmjob => Generation::Classic,
            PeerKind::XxlJob(generation) => generation,
        }
    }

    /// The application name to send in `XXL-JOB-APPNAME`: always, since every generation
    /// ignores it but 3.5, which requires it.
    pub fn app_name_header(&self) -> Option<&str> {
        Some(&self.app_name)
    }
}

/// What is known of each address (`None`: that it has no known kind), with when it was learned.
#[derive(Debug, Default)]
pub(super) struct Peers(Mutex<HashMap<String, Known>>);

#[derive(Debug)]
struct Known {
    at_ms: i64,
    peer: Option<Peer>,
    /// When a caller began to read the address's registration again, if it is reading it.
    reading_since_ms: Option<i64>,
}

impl Peers {
    /// What is known of the executor at `address`, however old.
    pub(super) fn get(&self, address: &str) -> Option<Peer> {
        self.0.lock().ok()?.get(address)?.peer.clone()
    }

    /// What is known of `address` if it was learned less than `PEER_TTL_MS` before `now_ms`.
    fn fresh(&self, address: &str, now_ms: i64) -> Option<Option<Peer>> {
        let peers = self.0.lock().ok()?;
        let known = peers.get(address)?;
        (known.at_ms <= now_ms && now_ms - known.at_ms < PEER_TTL_MS).then(|| known.peer.clone())
    }

    /// Remembers `peer` for `address` as of `at_ms`, unless something newer is known: a read
    /// that started before a registration arrived must not undo it.
    fn set(&self, address: &str, peer: Option<Peer>, at_ms: i64) {
        let Ok(mut peers) = self.0.lock() else { return };
        if peers.get(address).is_some_and(|known| known.at_ms > at_ms) {
            return;
        }
        if peers.len() >= MAX_REMEMBERED && !peers.contains_key(address) {
            peers.clear();
        }
        peers.insert(address.to_owned(), Known { at_ms, peer, reading_since_ms: None });
    }

    /// What is known of `address` however old, if a caller began to read it again less than
    /// `PEER_TTL_MS` before `now_ms`: the callers that find it expired together read it once,
    /// and the others are told what was known. Otherwise `None`, and the caller is marked as the
    /// one reading it (a read abandoned midway is taken over after that long).
    fn being_read(&self, address: &str, now_ms: i64) -> Option<Option<Peer>> {
        let mut peers = self.0.lock().ok()?;
        let known = peers.get_mut(address)?;
        if known.reading_since_ms.is_some_and(|since| now_ms - since < PEER_TTL_MS) {
            return Some(known.peer.clone());
        }
        known.reading_since_ms = Some(now_ms);
        None
    }

    /// The read of `address` that [`Peers::being_read`] marked failed.
    fn read_failed(&self, address: &str) {
        if let Ok(mut peers) = self.0.lock()
            && let Some(known) = peers.get_mut(address)
        {
            known.reading_since_ms = None;
        }
    }
}

impl Dispatcher {
    /// Remembers what the executor at `address` is (it just registered here, and its
    /// registration, kind included, is stored).
    pub fn note_peer(&self, address: &str, peer: Peer) {
        self.inner.peers.set(address, Some(peer), now_ms());
    }

    /// Forgets the executor at `address` (it deregistered).
    pub fn forget_peer(&self, address: &str) {
        self.inner.peers.set(address, None, now_ms());
    }

    /// What is known of the executor at `address`: from this admin's memory if it is recent,
    /// else from its stored registration (also one made through another admin, or before this
    /// admin started). If the database fails, what was known before.
    pub async fn peer(&self, address: &str) -> Option<Peer> {
        let read_at = now_ms();
        if let Some(known) = self.inner.peers.fresh(address, read_at) {
            return known;
        }
        if let Some(known) = self.inner.peers.being_read(address, read_at) {
            return known;
        }
        match self.inner.db.registered_peer(REGISTRY_GROUP_EXECUTOR, address).await {
            Ok(registered) => {
                let peer = registered.and_then(|registered| {
                    Peer::from_stored(&registered.peer_kind, registered.app_name)
                });
                self.inner.peers.set(address, peer, read_at);
                self.inner.peers.get(address)
            }
            Err(error) => {
                tracing::warn!(%error, "reading what answers at {address} failed");
                self.inner.peers.read_failed(address);
                self.inner.peers.get(address)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_that_find_an_address_expired_together_read_it_once() {
        let peers = Peers::default();
        let peer = Peer::from_registration("app", true, false, false);
        let renamed = Peer { app_name: "renamed".into(), ..peer.clone() };
        peers.set("a", Some(peer.clone()), 0);
        let expired = PEER_TTL_MS;
        assert_eq!(peers.fresh("a", expired), None);
        // The first caller reads; those after it, while it does, go on with what was known.
        assert_eq!(peers.being_read("a", expired), None);
        assert_eq!(peers.being_read("a", expired + 1), Some(Some(peer.clone())));
        peers.set("a", Some(renamed.clone()), expired);
        assert_eq!(peers.fresh("a", expired + 1), Some(Some(renamed.clone())));
        // A failed read lets the next caller read.
        let later = 2 * expired;
        assert_eq!(peers.being_read("a", later), None);
        peers.read_failed("a");
        assert_eq!(peers.being_read("a", later), None);
        // A read abandoned midway is taken over once it is as old as a copy may get.
        assert_eq!(peers.being_read("a", later + PEER_TTL_MS - 1), Some(Some(renamed)));
        assert_eq!(peers.being_read("a", later + PEER_TTL_MS), None);
        // An address never seen is read by each caller.
        assert_eq!(peers.being_read("b", later), None);
        assert_eq!(peers.being_read("b", later), None);
    }

    #[test]
    fn a_registration_tells_what_answers_at_an_address() {
        let kinds: Vec<(bool, bool, PeerKind, &str)> =
            [(true, true), (true, false), (false, true), (false, false)]
                .into_iter()
                .map(|(held, named)| {
                    let peer = Peer::from_registration("app", held, named, false);
                    (held, named, peer.kind, peer.generation().trigger_path())
                })
                .collect();
        assert_eq!(
            kinds,
            [
                (true, true, PeerKind::Wasmjob, "run"),
                (true, false, PeerKind::Wasmjob, "run"),
                (false, true, PeerKind::XxlJob(Generation::V3_5), "trigger"),
                (false, false, PeerKind::XxlJob(Generation::Classic), "run"),
            ]
        );
    }

    #[test]
    fn a_stored_kind_reads_back_as_itself_and_anything_else_as_unknown() {
        let kinds = [
            PeerKind::Wasmjob,
            PeerKind::XxlJob(Generation::Classic),
            PeerKind::XxlJob(Generation::V3_5),
        ];
        let stored: Vec<(&str, Option<PeerKind>)> =
            kinds.iter().map(|kind| (kind.as_str(), PeerKind::parse(kind.as_str()))).collect();
        assert_eq!(
            stored,
            [
                ("wasmjob", Some(PeerKind::Wasmjob)),
                ("xxl-job", Some(PeerKind::XxlJob(Generation::Classic))),
                ("xxl-job-3.5", Some(PeerKind::XxlJob(Generation::V3_5))),
            ]
        );
        for unknown in ["", "3.5", "XXL-JOB", "wasmjob "] {
            assert_eq!(PeerKind::parse(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn only_a_wasmjob_executor_that_says_so_is_sent_runs_ahead() {
        let holding: Vec<(bool, bool, &str, bool)> =
            [(true, true), (true, false), (false, true), (false, false)]
                .into_iter()
                .map(|(held, holds)| {
                    let peer = Peer::from_registration("app", held, false, holds);
                    let stored = Peer::from_stored(peer.stored_kind(), "app".to_owned());
                    assert_eq!(stored.as_ref(), Some(&peer), "{peer:?} reads back as itself");
                    (held, holds, peer.stored_kind(), peer.holds_triggers)
                })
                .collect();
        assert_eq!(
            holding,
            [
                (true, true, "wasmjob+holds", true),
                (true, false, "wasmjob", false),
                // A wasmjob executor holding too many runs to list them in a beat.
                (false, true, "wasmjob+holds", true),
                (false, false, "xxl-job", false),
            ]
        );
    }

    #[test]
    fn a_registration_is_not_undone_by_an_older_read() {
        let peers = Peers::default();
        let three_five = Peer::from_registration("app", false, true, false);
        peers.set("http://a", Some(three_five.clone()), 2_000);
        // A database read that started before the registration arrived.
        peers.set("http://a", None, 1_000);
        assert_eq!(peers.get("http://a"), Some(three_five.clone()));
        assert_eq!(peers.fresh("http://a", 2_000 + PEER_TTL_MS - 1), Some(Some(three_five)));
        assert_eq!(peers.fresh("http://a", 2_000 + PEER_TTL_MS), None, "read again");
        peers.set("http://a", None, 3_000);
        assert_eq!(peers.get("http://a"), None);
        assert_eq!(peers.fresh("http://b", 3_000), None, "never read");
    }
}
