//! Upload validation: are these bytes a job component we can run?
//!
//! Checked in order, cheapest first: not empty, wasm at all, a component (not a core module),
//! not a precompiled artifact, compiles, imports only what a job may import, exports the job
//! world's `run` with the right type. Size caps and compile time limits belong to the caller.

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Linker;

use super::bindings::JobPre;
use super::host::{RunState, is_allowed_import};

/// What validation learned of an accepted module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Lowercase hex sha256 of the bytes.
    pub sha256: String,
    /// Size in bytes.
    pub size: usize,
    /// The component's imports, by name.
    pub imports: Vec<String>,
}

/// Why bytes are not a job component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidateError {
    /// Nothing was uploaded.
    #[error("the module is empty")]
    Empty,
    /// Not WebAssembly at all.
    #[error("not a WebAssembly binary (no `\\0asm` header)")]
    NotWasm,
    /// WebAssembly, but of the wrong kind.
    #[error("{0}")]
    WrongKind(&'static str),
    /// The bytes do not compile.
    #[error("invalid component: {0}")]
    Invalid(String),
    /// It imports interfaces a job may not have.
    #[error("the component imports interfaces a job may not use: {}", .0.join(", "))]
    DisallowedImports(Vec<String>),
    /// It does not export `run` of the job world.
    #[error(
        "the component does not export the job world's `run: func(t: trigger) -> result<string, string>`: {0}"
    )]
    MissingExport(String),
}

impl ValidateError {
    /// The stable error code of the REST API.
    pub fn code(&self) -> &'static str {
        match self {
            ValidateError::Empty => "empty_module",
            ValidateError::NotWasm | ValidateError::Invalid(_) => "invalid_module",
            ValidateError::WrongKind(_) => "wrong_kind",
            ValidateError::DisallowedImports(_) => "disallowed_import",
            ValidateError::MissingExport(_) => "missing_export",
        }
    }
}

pub(super) fn validate(
    engine: &Engine,
    linker: &Linker<RunState>,
    bytes: &[u8],
) -> Result<ModuleInfo, ValidateError> {
    if bytes.is_empty() {
        return Err(ValidateError::Empty);
    }
    if Engine::detect_precompiled(bytes).is_some() {
        return Err(ValidateError::WrongKind(
            "a precompiled artifact: upload the component itself, artifacts are never accepted",
        ));
    }
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(ValidateError::NotWasm);
    }
    // Bytes 4..8 are the version and layer: 1,0,0,0 for a core module, 0x0d,0,1,0 for a component.
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(ValidateError::WrongKind(
            "a core WebAssembly module: a job must be a component (build for wasm32-wasip2)",
        ));
    }
    let component = super::compile(engine, bytes)
        .map_err(|error| ValidateError::Invalid(format!("{error:#}")))?;
    let imports: Vec<String> =
        component.component_type().imports(engine).map(|(name, _)| name.to_owned()).collect();
    let disallowed: Vec<String> =
        imports.iter().filter(|name| !is_allowed_import(name)).cloned().collect();
    if !disallowed.is_empty() {
        return Err(ValidateError::DisallowedImports(disallowed));
    }
    let pre = linker
        .instantiate_pre(&component)
        .map_err(|error| ValidateError::Invalid(format!("{error:#}")))?;
    JobPre::new(pre).map_err(|error| ValidateError::MissingExport(format!("{error:#}")))?;
    Ok(ModuleInfo { sha256: hex::encode(Sha256::digest(bytes)), size: bytes.len(), imports })
}
