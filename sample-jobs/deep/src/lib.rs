//! `deep`: a job that overflows its stack.
//!
//! Contract: param ignored. Logs `recursing` at info, then recurses without bound (not
//! tail-recursive, every frame kept alive through `black_box`) until the wasm stack
//! overflows. It never returns: it ends with a stack-overflow trap.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use std::hint::black_box;
use wasmjob::job::log::{Level, log};

#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    // A local buffer that escapes through black_box keeps each frame real.
    let frame = black_box([depth; 8]);
    let below = recurse(black_box(depth + 1));
    black_box(below.wrapping_add(frame[(depth % 8) as usize]))
}

struct Deep;

impl Guest for Deep {
    fn run(_t: Trigger) -> Result<String, String> {
        log(Level::Info, "recursing");
        let n = recurse(black_box(0));
        Ok(format!("unreachable: {n}"))
    }
}

export!(Deep);
