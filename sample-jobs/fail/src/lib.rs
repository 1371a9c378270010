//! `fail`: a job that fails cleanly.
//!
//! Contract: param = any text. Logs nothing; returns `Err("failed on purpose: <param>")`.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

struct Fail;

impl Guest for Fail {
    fn run(t: Trigger) -> Result<String, String> {
        Err(format!("failed on purpose: {}", t.param))
    }
}

export!(Fail);
