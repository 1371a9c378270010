//! `hog`: a job that grows its memory until the host refuses.
//!
//! Contract: param ignored. Allocates 1 MiB `Vec<u8>` chunks (each touched, kept alive
//! in a growing `Vec`) forever, logging `allocated <n> MiB` at info every 16 MiB. It never
//! returns: it ends when `memory.grow` is refused and the allocation failure aborts
//! (a trap), i.e. under the host's memory limit.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

use std::hint::black_box;
use wasmjob::job::log::{Level, log};

const CHUNK: usize = 1 << 20;

struct Hog;

impl Guest for Hog {
    fn run(_t: Trigger) -> Result<String, String> {
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        loop {
            let mut chunk = vec![0u8; CHUNK];
            // Touch one byte per 64 KiB page so the memory is really used.
            for i in (0..CHUNK).step_by(1 << 16) {
                chunk[i] = black_box(i as u8 | 1);
            }
            chunks.push(black_box(chunk));
            let mib = chunks.len();
            if mib % 16 == 0 {
                log(Level::Info, &format!("allocated {mib} MiB"));
            }
        }
    }
}

export!(Hog);
