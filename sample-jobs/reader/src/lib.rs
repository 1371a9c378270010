//! `reader`: a job that reads a file, and so imports `wasi:filesystem`.
//!
//! Contract: param = a path (empty means `/etc/hostname`). Reads it with
//! `std::fs::read_to_string` and returns `Ok(<content>)`, or `Err("<path>: <io error>")`.
//! It exists to prove that a component importing `wasi:filesystem/*` gets nothing from it: the
//! host links the interface with no preopened directory, so every read fails.

wit_bindgen::generate!({ world: "job", path: "../../wit" });

struct Reader;

impl Guest for Reader {
    fn run(t: Trigger) -> Result<String, String> {
        let path = if t.param.is_empty() { "/etc/hostname" } else { t.param.as_str() };
        std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
    }
}

export!(Reader);
