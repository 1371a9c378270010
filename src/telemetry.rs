//! Logging setup (tracing) and the process's shutdown signal.
//!
//! Logs go to stderr as text for people, or as JSON lines for a log pipeline
//! (`--log-format json`): one object a line with `time`, `level`, `target` and `message`, then
//! the fields of the event and of every span it happened in, so that a run's lines carry
//! `run_id`, `job_id` and `executor` on the admin's side as on the executor's. Field names are
//! written with `_` for `.` (`run.id` is `run_id`), as log stores take dots for nesting.
//!
//! This module decides how lines look, not what is logged: the spans and fields are where the
//! work happens.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::cli::LogFormat;

/// Installs the global subscriber: `RUST_LOG` or `info`, to stderr; text is colored only on a
/// terminal.
pub fn init(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => {
            builder.with_ansi(false).fmt_fields(JsonFields::new()).event_format(JsonLines).init()
        }
    }
}

/// Installs a subscriber that writes through the test harness, once per process.
pub fn init_for_test() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
}

/// The JSON lines format. Span fields are kept as JSON by [`JsonFields`] when recorded; each
/// event merges them, outermost span first, then its own fields on top.
struct JsonLines;

/// The keys every line starts with; a field of the same name is written `field_NAME`.
const FIXED_KEYS: [&str; 4] = ["time", "level", "target", "message"];

impl<S> FormatEvent<S, JsonFields> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut fields = BTreeMap::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(recorded) = extensions.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                if let Ok(Value::Object(recorded)) = serde_json::from_str(recorded.as_str()) {
                    fields.extend(recorded);
                }
            }
        }
        let mut visitor = FieldVisitor { fields: &mut fields, message: None };
        event.record(&mut visitor);
        let message = visitor.message.take().unwrap_or_default();
        let metadata = event.metadata();
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let json = |value: &str| Value::from(value).to_string();
        let mut line = format!(
            "{{\"time\":{},\"level\":{},\"target\":{},\"message\":{}",
            json(&time),
            json(metadata.level().as_str()),
            json(metadata.target()),
            json(&message)
        );
        for (name, value) in fields {
            let mut key = name.replace('.', "_");
            if FIXED_KEYS.contains(&key.as_str()) {
                key.insert_str(0, "field_");
            }
            write!(line, ",{}:{value}", json(&key))?;
        }
        line.push('}');
        writeln!(writer, "{line}")
    }
}

/// Collects an event's fields as JSON values, its message apart.
struct FieldVisitor<'a> {
    fields: &'a mut BTreeMap<String, Value>,
    message: Option<String>,
}

impl Visit for FieldVisitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.fields.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
        } else {
            self.fields.insert(field.name().to_owned(), Value::from(value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use expect_test::expect;

    use super::*;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_fields_of_the_event_and_its_spans() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(JsonLines)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let worker = tracing::info_span!("worker", job.id = 3, executor = "http://e:9999");
            let run = tracing::info_span!(parent: &worker, "run", run.id = 7_i64, attempt = 1);
            let _entered = run.enter();
            tracing::info!(handle.code = 200, ok = true, "run {} \"ended\"", 7);
            tracing::warn!(target: "wasmjob::other", level = "mine", error = %"boom", "odd");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let mut lines = Vec::new();
        for line in text.lines() {
            let mut value: Value = serde_json::from_str(line).unwrap();
            let time = value["time"].take();
            assert!(time.as_str().is_some_and(|time| time.ends_with('Z')), "{line}");
            lines.push(value.to_string());
        }
        expect![[r#"
            {"attempt":1,"executor":"http://e:9999","handle_code":200,"job_id":3,"level":"INFO","message":"run 7 \"ended\"","ok":true,"run_id":7,"target":"wasmjob::telemetry::tests","time":null}
            {"attempt":1,"error":"boom","executor":"http://e:9999","field_level":"mine","job_id":3,"level":"WARN","message":"odd","run_id":7,"target":"wasmjob::other","time":null}"#]]
        .assert_eq(&lines.join("\n"));
        // The fixed keys come first, in this order.
        assert!(text.starts_with("{\"time\":\""), "{text}");
        assert!(text.lines().all(|line| line.contains(",\"level\":")), "{text}");
    }
}
