//! How a run ended, in words an operator can act on, and XXL-JOB's handle code for it.
//!
//! `classify` is the one place that looks inside a `wasmtime::Error`: it tells a deadline from a
//! kill, fuel exhaustion from a trap, a refused allocation from a plain abort.

use std::fmt;

use crate::model::code;

/// The most bytes of a guest's message kept in the outcome.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// Why a run was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    Timeout,
    Killed,
}

/// How one run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// `run` returned `ok`.
    Success {
        /// The guest's message.
        message: String,
        /// Fuel consumed.
        fuel_used: Option<u64>,
    },
    /// `run` returned `err`.
    GuestError(String),
    /// The wall-clock deadline passed.
    Timeout,
    /// Killed by an operator, `/kill` or `COVER_EARLY`.
    Killed,
    /// The fuel budget was spent.
    OutOfFuel,
    /// The guest trapped (`kind` is wasmtime's trap name: unreachable, stack overflow...).
    Trap {
        /// The trap's kind.
        kind: String,
        /// wasmtime's description, with the guest backtrace when there is one.
        detail: String,
    },
    /// A memory or table limit was reached.
    ResourceLimit(String),
    /// The component could not be instantiated.
    Instantiate(String),
    /// The host failed (not the guest's fault).
    Host(String),
}

impl RunOutcome {
    /// XXL-JOB's handle code: 200 success, 502 timeout, 500 everything else.
    pub fn handle_code(&self) -> i32 {
        match self {
            RunOutcome::Success { .. } => code::SUCCESS,
            RunOutcome::Timeout => code::TIMEOUT,
            _ => code::FAILURE,
        }
    }

    /// The handle message, capped at [`MAX_MESSAGE_BYTES`].
    pub fn handle_msg(&self) -> String {
        let text = self.to_string();
        cap(&text, MAX_MESSAGE_BYTES)
    }
}

impl fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunOutcome::Success { message, .. } => f.write_str(message),
            RunOutcome::GuestError(message) => write!(f, "job failed: {message}"),
            RunOutcome::Timeout => {
                f.write_str("timeout: the run passed its deadline and was stopped")
            }
            RunOutcome::Killed => f.write_str("killed: the run was stopped on request"),
            RunOutcome::OutOfFuel => f.write_str("out of fuel: the run spent its fuel budget"),
            RunOutcome::Trap { kind, detail } => write!(f, "trap ({kind}): {detail}"),
            RunOutcome::ResourceLimit(what) => write!(f, "resource limit: {what}"),
            RunOutcome::Instantiate(error) => write!(f, "instantiation failed: {error}"),
            RunOutcome::Host(error) => write!(f, "host error: {error}"),
        }
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut.
pub fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [truncated]", &text[..end])
}

pub(super) fn classify(
    result: Result<wasmtime::Result<Result<String, String>>, Stop>,
    cancelled: bool,
    fuel_used: Option<u64>,
    denied: Option<String>,
) -> RunOutcome {
    let error = match result {
        Err(Stop::Timeout) => return RunOutcome::Timeout,
        Err(Stop::Killed) => return RunOutcome::Killed,
        Ok(Ok(Ok(message))) => {
            return RunOutcome::Success { message: cap(&message, MAX_MESSAGE_BYTES), fuel_used };
        }
        Ok(Ok(Err(message))) => return RunOutcome::GuestError(cap(&message, MAX_MESSAGE_BYTES)),
        Ok(Err(error)) => error,
    };
    if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
        return match trap {
            wasmtime::Trap::Interrupt if cancelled => RunOutcome::Killed,
            wasmtime::Trap::Interrupt => RunOutcome::Timeout,
            wasmtime::Trap::OutOfFuel => RunOutcome::OutOfFuel,
            _ if denied.is_some() => RunOutcome::ResourceLimit(denied.unwrap_or_default()),
            other => RunOutcome::Trap {
                kind: trap_kind(*other).to_owned(),
                detail: cap(&format!("{error:?}"), MAX_MESSAGE_BYTES),
            },
        };
    }
    if let Some(what) = denied {
        return RunOutcome::ResourceLimit(what);
    }
    let detail = cap(&format!("{error:#}"), MAX_MESSAGE_BYTES);
    // Instantiation errors carry no trap; the failing step names itself in the message.
    if detail.contains("instantiat") || detail.contains("unknown import") {
        return RunOutcome::Instantiate(detail);
    }
    RunOutcome::Host(detail)
}

fn trap_kind(trap: wasmtime::Trap) -> &'static str {
    match trap {
        wasmtime::Trap::StackOverflow => "stack overflow",
        wasmtime::Trap::MemoryOutOfBounds => "memory out of bounds",
        wasmtime::Trap::HeapMisaligned => "misaligned access",
        wasmtime::Trap::TableOutOfBounds => "table out of bounds",
        wasmtime::Trap::IndirectCallToNull => "indirect call to null",
        wasmtime::Trap::BadSignature => "bad signature",
        wasmtime::Trap::IntegerOverflow => "integer overflow",
        wasmtime::Trap::IntegerDivisionByZero => "integer division by zero",
        wasmtime::Trap::BadConversionToInteger => "bad conversion to integer",
        wasmtime::Trap::UnreachableCodeReached => "unreachable (guest panic or abort)",
        wasmtime::Trap::Interrupt => "interrupt",
        wasmtime::Trap::OutOfFuel => "out of fuel",
        _ => "other",
    }
}
