//! A real headless Chromium for the console's tests, driven over the WebDriver protocol
//! through Debian's `chromedriver`, with the HTTP client the tests already use.
//!
//! Only the handful of WebDriver commands the tests need are here. [`Browser::start`] answers
//! `None`, with a message saying what to install, when `chromium` or `chromedriver` is missing.
//! The driver process is stopped by PID when the [`Browser`] is dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// The key W3C WebDriver names elements by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    http: reqwest::Client,
    session: String,
    driver: Child,
    _profile: tempfile::TempDir,
}

/// An element of the current page.
pub struct Element(String);

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let dirs = ["/usr/bin", "/usr/local/bin", "/usr/lib/chromium", "/snap/bin"];
    dirs.iter()
        .flat_map(|dir| names.iter().map(move |name| Path::new(dir).join(name)))
        .find(|path| path.is_file())
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session of 1280×800.
    pub async fn start() -> Option<Browser> {
        let (Some(chromium), Some(driver)) =
            (find_program(&["chromium", "chromium-browser"]), find_program(&["chromedriver"]))
        else {
            eprintln!(
                "SKIPPED: the browser tests need Debian's chromium and chromium-driver \
                 (apt-get install chromium chromium-driver; .ci/run installs them)"
            );
            return None;
        };
        let (driver, port) = start_driver(&driver);
        let profile = tempfile::tempdir().unwrap();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,800", format!("--user-data-dir={}", profile.path().display())],
            },
        }}});
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let reply: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session =
            reply["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {reply}"));
        Some(Browser {
            http,
            session: format!("{base}/session/{session}"),
            driver,
            _profile: profile,
        })
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let request = self.http.request(method, format!("{}{path}", self.session));
        let request = if body.is_null() { request } else { request.json(&body) };
        let reply: Value = request.send().await.unwrap().json().await.unwrap();
        reply["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.command(reqwest::Method::POST, path, body).await
    }

    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({"url": url})).await;
    }

    /// The first element matching `css`, if there is one now.
    pub async fn find(&self, css: &str) -> Option<Element> {
        let found = self.post("/element", json!({"using": "css selector", "value": css})).await;
        found[ELEMENT].as_str().map(|id| Element(id.to_owned()))
    }

    /// The element matching `css`, waiting for it to appear.
    pub async fn wait_for(&self, css: &str) -> Element {
        crate::support::wait_until(&format!("`{css}` appears"), || self.find(css)).await
    }

    pub async fn fill(&self, css: &str, text: &str) {
        let element = self.wait_for(css).await;
        self.post(&format!("/element/{}/clear", element.0), json!({})).await;
        self.post(&format!("/element/{}/value", element.0), json!({"text": text})).await;
    }

    /// Chooses option `value` of the select `css` as a person would, firing `input` and
    /// `change`; false when the select has no such option.
    pub async fn select(&self, css: &str, value: &str) -> bool {
        self.wait_for(css).await;
        let script = "const [css, value] = arguments;
            const select = document.querySelector(css);
            select.value = value;
            for (const kind of ['input', 'change']) select.dispatchEvent(new Event(kind, {bubbles: true}));
            return select.value === value;";
        self.post("/execute/sync", json!({"script": script, "args": [css, value]})).await == true
    }

    pub async fn click(&self, css: &str) {
        let element = self.wait_for(css).await;
        self.post(&format!("/element/{}/click", element.0), json!({})).await;
    }

    pub async fn text(&self, css: &str) -> String {
        let element = self.wait_for(css).await;
        let text = self
            .command(reqwest::Method::GET, &format!("/element/{}/text", element.0), Value::Null)
            .await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// Waits until the text of `css` contains `wanted`.
    pub async fn wait_for_text(&self, css: &str, wanted: &str) -> String {
        crate::support::wait_until(&format!("`{css}` shows `{wanted}`"), || async {
            let element = self.find(css).await?;
            let text = self
                .command(reqwest::Method::GET, &format!("/element/{}/text", element.0), Value::Null)
                .await;
            let text = text.as_str().unwrap_or_default().to_owned();
            text.contains(wanted).then_some(text)
        })
        .await
    }

    /// Waits until the text of `css` contains `wanted`, for at most `patience`: for what waits
    /// on a build, which takes far longer than a page.
    pub async fn wait_for_text_within(
        &self,
        css: &str,
        wanted: &str,
        patience: Duration,
    ) -> String {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Some(element) = self.find(css).await {
                let path = format!("/element/{}/text", element.0);
                let text = self.command(reqwest::Method::GET, &path, Value::Null).await;
                let text = text.as_str().unwrap_or_default();
                if text.contains(wanted) {
                    return text.to_owned();
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting until `{css}` shows `{wanted}`"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Runs `script` (a function body; `arguments` holds `args`, the last being the callback).
    pub async fn run_async(&self, script: &str, args: Value) -> Value {
        self.post("/execute/async", json!({"script": script, "args": args})).await
    }

    pub async fn run(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": []})).await
    }

    /// Accepts the `confirm()` dialog the last action opened, waiting for it to open.
    pub async fn accept_dialog(&self) -> String {
        let text = crate::support::wait_until("a dialog opens", || async {
            let text = self.command(reqwest::Method::GET, "/alert/text", Value::Null).await;
            text.as_str().map(str::to_owned)
        })
        .await;
        self.post("/alert/accept", json!({})).await;
        text
    }

    pub async fn resize(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({"width": width, "height": height})).await;
    }

    /// Saves a PNG of the viewport to `path`.
    pub async fn screenshot(&self, path: &Path) {
        use base64::Engine;
        let data = self.command(reqwest::Method::GET, "/screenshot", Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD.decode(data.as_str().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// The console messages of level `SEVERE` logged since the last call.
    pub async fn console_errors(&self) -> Vec<String> {
        let logs = self.post("/se/log", json!({"type": "browser"})).await;
        logs.as_array()
            .map(|entries| {
                entries
                    .iter()
                    .filter(|entry| entry["level"] == "SEVERE")
                    .map(|entry| entry["message"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Browser {
    /// Ends the session (the driver closes its browser), then stops the driver.
    pub async fn quit(self) {
        self.command(reqwest::Method::DELETE, "", Value::Null).await;
    }
}

/// Starts chromedriver on a port of its choosing and reads that port from what it prints. Under
/// a loaded machine chromedriver has been seen to exit before it says its port; it is started
/// again then, three times at most, and what it wrote to stderr is in the panic if it never
/// comes up.
fn start_driver(program: &Path) -> (Child, String) {
    let mut errors = Vec::new();
    for _ in 0..3 {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut driver = Command::new(program)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("starting chromedriver");
        let stdout = driver.stdout.take().unwrap();
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) =
                    line.split_once("started successfully on port ").map(|(_, rest)| rest)
                {
                    let _ = sender.send(rest.trim_end_matches('.').trim().to_owned());
                }
            }
        });
        match receiver.recv_timeout(Duration::from_secs(30)) {
            Ok(port) => return (driver, port),
            Err(error) => {
                let _ = driver.kill();
                let status = driver.wait().map(|status| status.to_string()).unwrap_or_default();
                let stderr = std::fs::read_to_string(log.path()).unwrap_or_default();
                errors.push(format!("{error} ({status}): {}", stderr.trim()));
            }
        }
    }
    panic!("chromedriver did not say its port: {errors:?}");
}

impl Drop for Browser {
    fn drop(&mut self) {
        // After a failed test the session may still be open: stop the browser the driver
        // started (its children, by PID), then the driver itself.
        for pid in children(self.driver.id()) {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The processes whose parent is `parent`, from `/proc`.
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The fields after the command's closing parenthesis: state, then the parent's PID.
            let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            rest.split_whitespace().nth(1).and_then(|ppid| ppid.parse::<u32>().ok()) == Some(parent)
        })
        .collect()
}
