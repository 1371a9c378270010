//! `spin`: a job that never ends on its own.
//!
//! Contract: param ignored. Logs nothing, never returns: it busy-loops forever on a
//! `black_box` counter (no host calls), so only the host's CPU limit (fuel/epoch
//! interruption or a timeout) can end it, with a trap.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use std::hint::black_box;

struct Spin;

impl Guest for Spin {
    fn run(_t: Trigger) -> Result<String, String> {
        let mut n: u64 = 0;
        loop {
            n = black_box(n.wrapping_add(1));
        }
    }
}

export!(Spin);
