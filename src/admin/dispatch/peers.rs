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
//! The knowledge is in memory and renewed by every beat (every 30 s), so after an admin restart,
//! or on an admin an executor does not beat to, an executor is unknown until it beats there; an
//! unknown executor is spoken to as a classic one (`/run`), and a kill on it says that it may
//! stop the job's whole queue. It does not persist anything.

use std::collections::HashMap;
use std::sync::Mutex;

use super::Dispatcher;
use crate::protocol::Generation;

/// Which software answers at an executor address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerKind {
    /// A wasmjob executor: it kills single runs and reports the runs it holds.
    Wasmjob,
    /// An XXL-JOB executor of this generation.
    XxlJob(Generation),
}

/// One registered executor, as its last registration described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// What answers there.
    pub kind: PeerKind,
    /// The application it registered for.
    pub app_name: String,
}

impl Peer {
    /// The peer a registration describes: whether it listed held runs, and whether it named its
    /// application in `XXL-JOB-APPNAME`.
    pub fn from_registration(app_name: &str, lists_held_runs: bool, names_app: bool) -> Peer {
        let kind = match (lists_held_runs, names_app) {
            (true, _) => PeerKind::Wasmjob,
            (false, true) => PeerKind::XxlJob(Generation::V3_5),
            (false, false) => PeerKind::XxlJob(Generation::Classic),
        };
        Peer { kind, app_name: app_name.to_owned() }
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
        Some(self.app_name.as_str())
    }
}

/// The peers by address.
#[derive(Debug, Default)]
pub(super) struct Peers(Mutex<HashMap<String, Peer>>);

impl Peers {
    /// What is known of the executor at `address`.
    pub(super) fn get(&self, address: &str) -> Option<Peer> {
        self.0.lock().ok()?.get(address).cloned()
    }

    fn set(&self, address: &str, peer: Option<Peer>) {
        let Ok(mut peers) = self.0.lock() else { return };
        match peer {
            Some(peer) => {
                peers.insert(address.to_owned(), peer);
            }
            None => {
                peers.remove(address);
            }
        }
    }
}

impl Dispatcher {
    /// Records what the executor at `address` is (it just registered).
    pub fn note_peer(&self, address: &str, peer: Peer) {
        self.inner.peers.set(address, Some(peer));
    }

    /// Forgets the executor at `address` (it deregistered).
    pub fn forget_peer(&self, address: &str) {
        self.inner.peers.set(address, None);
    }

    /// What is known of the executor at `address`, if it registered with this admin.
    pub fn peer(&self, address: &str) -> Option<Peer> {
        self.inner.peers.get(address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_tells_what_answers_at_an_address() {
        let kinds: Vec<(bool, bool, PeerKind, &str)> =
            [(true, true), (true, false), (false, true), (false, false)]
                .into_iter()
                .map(|(held, named)| {
                    let peer = Peer::from_registration("app", held, named);
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
}
