//! The client's config file: the admin's URL and a token, for when neither a flag nor the
//! environment gives them.
//!
//! ```toml
//! admin_url = "https://scheduler.example.com:8080"
//! token = "wjt_…"
//! ```
//!
//! The file is `--config FILE`, else `$XDG_CONFIG_HOME/wasmjob/config.toml`, else
//! `~/.config/wasmjob/config.toml`. The default file may be missing; `--config`'s may not.
//! A file that is there is read whole and checked: unknown keys, wrong types and a URL that
//! is not http(s) are refused with one line naming the file (and the line, for syntax).
//! This module only reads: it never writes the file, and it decides no precedence.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// What a config file holds; every key is optional.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The admin's base URL.
    pub admin_url: Option<String>,
    /// A bearer token: the operator token or a personal API token.
    pub token: Option<String>,
}

/// Where the config file is looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub path: PathBuf,
    /// Whether it was named with `--config` (then it must exist).
    pub named: bool,
}

/// A config file that is there but cannot be used; its text is one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// It could not be read.
    #[error("config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not valid TOML, or has keys or values this client does not take.
    #[error("config file {}:{line}:{column}: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The line of the error, from 1.
        line: usize,
        /// The column of the error, from 1.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A value is of the right type but unusable.
    #[error("config file {}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The config file to read: `named` (`--config`), else the XDG place under `xdg_config_home`
/// (when it is absolute, as the XDG spec asks), else `.config` under `home`.
pub fn location(
    named: Option<&Path>,
    xdg_config_home: Option<&Path>,
    home: Option<&Path>,
) -> Option<Location> {
    if let Some(path) = named {
        return Some(Location { path: path.to_owned(), named: true });
    }
    let dir = match xdg_config_home.filter(|dir| dir.is_absolute()) {
        Some(dir) => dir.to_owned(),
        None => home.filter(|home| !home.as_os_str().is_empty())?.join(".config"),
    };
    Some(Location { path: dir.join("wasmjob").join("config.toml"), named: false })
}

/// Reads and checks the file at `location`; an empty config when the default file is missing.
pub fn load(location: &Location) -> Result<ConfigFile, ConfigFileError> {
    let path = &location.path;
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && !location.named => {
            return Ok(ConfigFile::default());
        }
        Err(source) => return Err(ConfigFileError::Read { path: path.clone(), source }),
    };
    parse(path, &text)
}

fn parse(path: &Path, text: &str) -> Result<ConfigFile, ConfigFileError> {
    let config: ConfigFile = toml::from_str(text).map_err(|error| {
        // The error's own text spans several lines (a snippet of the file): keep its message
        // and turn its span into a line and column.
        let offset = error.span().map_or(0, |span| span.start).min(text.len());
        let before = &text[..text.floor_char_boundary(offset)];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |last| last.chars().count()) + 1;
        let message = error.message().trim().replace('\n', "; ");
        ConfigFileError::Syntax { path: path.to_owned(), line, column, message }
    })?;
    let invalid = |message: String| ConfigFileError::Invalid { path: path.to_owned(), message };
    if let Some(admin_url) = &config.admin_url {
        let parsed = url::Url::parse(admin_url)
            .map_err(|error| invalid(format!("admin_url `{admin_url}`: {error}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid(format!("admin_url `{admin_url}` is not an http(s) URL")));
        }
    }
    if config.token.as_deref().is_some_and(|token| token.trim().is_empty()) {
        return Err(invalid("token is empty".to_owned()));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};

    use super::*;

    fn check(text: &str, expected: Expect) {
        let out = match parse(Path::new("/home/me/.config/wasmjob/config.toml"), text) {
            Ok(config) => format!("{config:?}"),
            Err(error) => error.to_string(),
        };
        expected.assert_eq(&out);
    }

    #[test]
    fn config_files_are_checked() {
        check("", expect![[r#"ConfigFile { admin_url: None, token: None }"#]]);
        check(
            "# mine\nadmin_url = \"https://sched.example:8080\"\ntoken = \"wjt_x\"\n",
            expect![[
                r#"ConfigFile { admin_url: Some("https://sched.example:8080"), token: Some("wjt_x") }"#
            ]],
        );
        check(
            "admin_url = \"http://a\"\ntoken = wjt_x\n",
            expect![[
                r#"config file /home/me/.config/wasmjob/config.toml:2:9: string values must be quoted, expected literal string"#
            ]],
        );
        check(
            "admin_url = \"http://a\"\nadmin-url = \"http://b\"\n",
            expect![[
                r#"config file /home/me/.config/wasmjob/config.toml:2:1: unknown field `admin-url`, expected `admin_url` or `token`"#
            ]],
        );
        check(
            "token = 7",
            expect![[
                r#"config file /home/me/.config/wasmjob/config.toml:1:9: invalid type: integer `7`, expected a string"#
            ]],
        );
        check(
            "admin_url = \"ftp://files\"",
            expect![[
                r#"config file /home/me/.config/wasmjob/config.toml: admin_url `ftp://files` is not an http(s) URL"#
            ]],
        );
        check(
            "token = \" \"",
            expect![[r#"config file /home/me/.config/wasmjob/config.toml: token is empty"#]],
        );
    }

    #[test]
    fn the_file_is_named_or_under_the_config_dir() {
        let at = |named: Option<&str>, xdg: Option<&str>, home: Option<&str>| {
            location(named.map(Path::new), xdg.map(Path::new), home.map(Path::new))
                .map(|location| format!("{} named={}", location.path.display(), location.named))
        };
        assert_eq!(
            at(Some("my.toml"), Some("/x"), Some("/h")).as_deref(),
            Some("my.toml named=true")
        );
        assert_eq!(
            at(None, Some("/x"), Some("/h")).as_deref(),
            Some("/x/wasmjob/config.toml named=false")
        );
        // The XDG spec: a relative (or empty) XDG_CONFIG_HOME is ignored.
        assert_eq!(
            at(None, Some("rel"), Some("/h")).as_deref(),
            Some("/h/.config/wasmjob/config.toml named=false")
        );
        assert_eq!(at(None, Some(""), None), None);
    }
}
