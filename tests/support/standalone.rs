//! `wasmjob standalone` as a process of the test's, stopped by PID.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A standalone process that is killed (by PID) if the test ends without stopping it.
pub struct Standalone(Option<Child>);

impl Standalone {
    /// The process id (0 once stopped).
    pub fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `wasmjob standalone` on port 0 and returns it, once it is up, with its admin URL (read
/// from its log).
pub fn spawn_standalone(data_dir: &std::path::Path) -> (Standalone, String) {
    spawn_standalone_at(data_dir, "127.0.0.1:0")
}

/// [`spawn_standalone`] with its executor listening at `executor_listen`: a restart at the
/// address its runs were sent to before.
pub fn spawn_standalone_at(
    data_dir: &std::path::Path,
    executor_listen: &str,
) -> (Standalone, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmjob"))
        .args(["standalone", "--admin-listen", "127.0.0.1:0", "--executor-listen", executor_listen])
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", "info")
        .env_remove("WASMJOB_ADMIN_TOKEN")
        .env_remove("WASMJOB_ACCESS_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // The admin listens before the standalone has made its `default` group and started
        // its executor: the URL is handed over once the whole platform says it is up.
        let (mut url, mut sent) = (None, false);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some((_, listening)) = line.split_once("admin listening on ") {
                url.get_or_insert_with(|| listening.trim().to_owned());
            }
            if !sent
                && line.contains("wasmjob standalone is up")
                && let Some(url) = url.take()
            {
                sender.send(url).unwrap();
                sent = true;
            }
        }
    });
    let url = receiver
        .recv_timeout(Duration::from_secs(60))
        .expect("standalone did not log its admin address");
    (Standalone(Some(child)), url)
}

/// SIGTERM: a graceful stop that deregisters the executor and exits 0.
pub fn stop_gracefully(mut standalone: Standalone) {
    let mut child = standalone.0.take().expect("running");
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = child.wait().unwrap();
    assert!(status.success(), "standalone exited with {status}");
}
