//! The guest's stdout and stderr: streamed into the run's log line by line, as they are written.
//!
//! A stream never refuses a write and never fills up: a guest that prints a lot must not fail
//! (Rust's `println!` panics when stdout errors), so the cap lives in the log sink, which cuts
//! the run's log with one marker. What is held in memory is one partial line, at most
//! [`MAX_PARTIAL_LINE`] bytes; a longer line is emitted in pieces.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use super::{Level, LogSink};

/// The longest partial line held before it is written out as it is.
pub const MAX_PARTIAL_LINE: usize = 16 * 1024;

/// The run's log sink, shared by the `log` import and both output streams.
pub(super) type SharedSink = Arc<Mutex<Box<dyn LogSink>>>;

/// One of the guest's output streams, writing into the run's log at `level`.
#[derive(Clone)]
pub(super) struct LogStream {
    inner: Arc<Mutex<Partial>>,
}

struct Partial {
    sink: SharedSink,
    level: Level,
    line: Vec<u8>,
    /// The last few lines, kept to explain a trap (a Rust panic message lands on stderr).
    recent: VecDeque<String>,
}

/// How many recent lines a stream remembers, and how much of each.
const RECENT_LINES: usize = 3;
const RECENT_LINE_BYTES: usize = 512;

impl LogStream {
    pub(super) fn new(sink: SharedSink, level: Level) -> LogStream {
        let partial = Partial { sink, level, line: Vec::new(), recent: VecDeque::new() };
        LogStream { inner: Arc::new(Mutex::new(partial)) }
    }

    fn accept(&self, mut bytes: &[u8]) {
        let Ok(mut partial) = self.inner.lock() else { return };
        while let Some(newline) = bytes.iter().position(|&b| b == b'\n') {
            partial.push(&bytes[..newline]);
            partial.emit();
            bytes = &bytes[newline + 1..];
        }
        partial.push(bytes);
    }

    /// The last lines written, oldest first, skipping Rust's `note: run with RUST_BACKTRACE` hint.
    pub(super) fn recent_lines(&self) -> Vec<String> {
        self.inner
            .lock()
            .map(|partial| partial.recent.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Writes out a last line that had no newline.
    pub(super) fn finish(&self) {
        if let Ok(mut partial) = self.inner.lock()
            && !partial.line.is_empty()
        {
            partial.emit();
        }
    }
}

impl Partial {
    fn push(&mut self, mut bytes: &[u8]) {
        while self.line.len() + bytes.len() > MAX_PARTIAL_LINE {
            let room = MAX_PARTIAL_LINE - self.line.len();
            self.line.extend_from_slice(&bytes[..room]);
            self.emit();
            bytes = &bytes[room..];
        }
        self.line.extend_from_slice(bytes);
    }

    fn emit(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        let text = text.trim_end_matches('\r');
        if let Ok(mut sink) = self.sink.lock() {
            sink.line(self.level, text);
        }
        let trimmed = text.trim();
        if !trimmed.is_empty() && !trimmed.starts_with("note: run with") {
            if self.recent.len() == RECENT_LINES {
                self.recent.pop_front();
            }
            self.recent.push_back(super::outcome::cap(trimmed, RECENT_LINE_BYTES));
        }
        self.line.clear();
    }
}

impl IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for LogStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.accept(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LogStream {
    async fn ready(&mut self) {}
}

impl AsyncWrite for LogStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.accept(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
