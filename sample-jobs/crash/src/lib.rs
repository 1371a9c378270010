//! `crash`: a job that panics.
//!
//! Contract: param = any text. Logs nothing through `log`; panics with the message
//! `crash requested: <param>` (the panic hook writes it to stderr), and with
//! `panic = "abort"` it ends with a trap. It never returns.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

struct Crash;

impl Guest for Crash {
    fn run(t: Trigger) -> Result<String, String> {
        panic!("crash requested: {}", t.param);
    }
}

export!(Crash);
