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

/// Which step of a run failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Instantiate,
    Call,
}

/// What a run's call returned: the guest's own result, or the step that failed and why;
/// `Err(Stop)` when the deadline or a kill abandoned it from outside.
pub(super) type CallResult = Result<Result<Result<String, String>, (Phase, wasmtime::Error)>, Stop>;

/// What the store knew when the run ended.
pub(super) struct Facts {
    pub(super) cancelled: bool,
    pub(super) fuel_used: Option<u64>,
    /// The first memory or table growth the limiter refused.
    pub(super) denied: Option<String>,
    pub(super) stderr_tail: Option<String>,
}

pub(super) fn classify(result: CallResult, facts: Facts) -> RunOutcome {
    let (phase, error) = match result {
        Err(Stop::Timeout) => return RunOutcome::Timeout,
        Err(Stop::Killed) => return RunOutcome::Killed,
        Ok(Ok(Ok(message))) => {
            let message = cap(&message, MAX_MESSAGE_BYTES);
            return RunOutcome::Success { message, fuel_used: facts.fuel_used };
        }
        Ok(Ok(Err(message))) => return RunOutcome::GuestError(cap(&message, MAX_MESSAGE_BYTES)),
        Ok(Err(failure)) => failure,
    };
    if let Some(what) = facts.denied {
        // A refused growth is the cause even when the guest then trapped (a Rust guest aborts
        // when allocation fails) or instantiation failed (initial memory above the cap).
        return RunOutcome::ResourceLimit(what);
    }
    if phase == Phase::Instantiate {
        let detail = cap(&format!("{error:#}"), MAX_MESSAGE_BYTES);
        // An exhausted instance pool is the executor's concurrency cap, not the module's fault.
        if detail.contains("maximum concurrent") || detail.contains("pooling") {
            return RunOutcome::Instantiate(format!("executor busy: {detail}"));
        }
        return RunOutcome::Instantiate(detail);
    }
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return RunOutcome::GuestError(format!(
            "the guest exited with status {} instead of returning",
            exit.0
        ));
    }
    let Some(trap) = error.downcast_ref::<wasmtime::Trap>() else {
        return RunOutcome::Host(cap(&format!("{error:#}"), MAX_MESSAGE_BYTES));
    };
    match trap {
        wasmtime::Trap::Interrupt if facts.cancelled => RunOutcome::Killed,
        wasmtime::Trap::Interrupt => RunOutcome::Timeout,
        wasmtime::Trap::OutOfFuel => RunOutcome::OutOfFuel,
        other => {
            // The guest's last words (a panic message) say more than the trap itself.
            let detail = match facts.stderr_tail {
                Some(tail) => format!("{trap}; stderr: {tail}"),
                None => trap.to_string(),
            };
            RunOutcome::Trap {
                kind: trap_kind(*other).to_owned(),
                detail: cap(&detail, MAX_MESSAGE_BYTES),
            }
        }
    }
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
