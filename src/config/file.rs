//! A daemon's configuration file (`--config FILE`, TOML): one key per flag of its subcommand.
//!
//! The keys are not listed here: they are the subcommand's flags as clap knows them, with `-`
//! written `_` (`--database-url` is `database_url`), and the global `--log-format`. A flag added
//! to `cli` is a key at once, with the same parser. A file is checked whole before anything
//! starts: a key that is no flag, a value of the wrong TOML type, or one the flag's own parser
//! refuses stops the process with the file, the line and the column. The file's values then
//! become the flags' defaults ([`ConfigFile::apply`]), which is what puts them below the command
//! line and the environment and above the built-in defaults.
//!
//! This module does not read the environment nor the secrets' `_file`s (`command_line` does),
//! and it never writes the file.

use std::any::TypeId;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, Command};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// A configuration file, checked against the flags of its subcommand.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// The file.
    pub path: PathBuf,
    settings: Vec<Setting>,
}

/// A configuration file that cannot be used; its text is one line.
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
    /// It is not TOML, or a key is no flag, or a value is of the wrong type or refused.
    #[error("config file {}:{line}:{column}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line of the error, from 1.
        line: usize,
        /// The column of the error, from 1.
        column: usize,
        /// What is wrong.
        message: String,
    },
}

/// A flag a configuration file may set.
#[derive(Debug, Clone)]
pub struct Key {
    /// The key: the long flag with `-` written `_`.
    pub name: String,
    /// The flag's id in clap.
    pub id: String,
    /// Whether the flag is a global one of the root command (`--log-format`).
    pub global: bool,
    /// The TOML type of its values.
    pub kind: Kind,
    /// Whether it takes a list (`admin_url = ["…", "…"]`).
    pub list: bool,
    /// The flag's parser, which checks each value.
    parser: clap::builder::ValueParser,
    /// The values it takes, when it names them (`log_format`).
    possible: Vec<String>,
}

/// The TOML type a key takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `true` or `false`.
    Boolean,
    /// An integer.
    Integer,
    /// A string.
    String,
}

/// One key the file sets, as the flag's values.
#[derive(Debug, Clone)]
struct Setting {
    key: Key,
    values: Vec<String>,
}

/// Ids of a daemon's flags that are about the file itself, not keys in it.
const NOT_KEYS: &[&str] = &["config", "print_config"];

/// The keys a file for `subcommand` (of `root`) may hold, in the order of `--help`.
pub fn keys(root: &Command, subcommand: &Command) -> Vec<Key> {
    let own = subcommand.get_arguments().map(|arg| (arg, false));
    let global = root.get_arguments().filter(|arg| arg.is_global_set()).map(|arg| (arg, true));
    let mut args: Vec<(&Arg, bool)> = own
        .chain(global)
        .filter(|(arg, _)| !arg.is_hide_set() && !NOT_KEYS.contains(&arg.get_id().as_str()))
        .filter(|(arg, _)| {
            !matches!(arg.get_action(), ArgAction::Help | ArgAction::Version | ArgAction::HelpLong)
        })
        .collect();
    args.sort_by_key(|(arg, global)| (*global, arg.get_display_order()));
    args.into_iter()
        .filter_map(|(arg, global)| {
            let long = arg.get_long()?;
            Some(Key {
                name: long.replace('-', "_"),
                id: arg.get_id().to_string(),
                global,
                kind: kind(arg),
                list: is_list(arg),
                parser: arg.get_value_parser().clone(),
                possible: arg
                    .get_possible_values()
                    .iter()
                    .map(|v| v.get_name().to_owned())
                    .collect(),
            })
        })
        .collect()
}

impl ConfigFile {
    /// Reads the file at `path` and checks it against the flags of `subcommand` (of `root`).
    pub fn load(
        path: &Path,
        root: &Command,
        subcommand: &Command,
    ) -> Result<ConfigFile, ConfigFileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigFileError::Read { path: path.to_owned(), source })?;
        ConfigFile::parse(path, &text, root, subcommand)
    }

    /// Checks `text`, the content of `path`, against the flags of `subcommand` (of `root`).
    pub fn parse(
        path: &Path,
        text: &str,
        root: &Command,
        subcommand: &Command,
    ) -> Result<ConfigFile, ConfigFileError> {
        let invalid = |span: std::ops::Range<usize>, message: String| {
            let (line, column) = line_and_column(text, span.start);
            ConfigFileError::Invalid { path: path.to_owned(), line, column, message }
        };
        let table = DeTable::parse(text).map_err(|error| {
            // The error's own text spans several lines (a snippet of the file): keep its
            // message and turn its span into a line and a column.
            invalid(error.span().unwrap_or(0..0), error.message().trim().replace('\n', "; "))
        })?;
        let keys = keys(root, subcommand);
        let mut settings = Vec::new();
        for (name, value) in table.get_ref() {
            let Some(key) = keys.iter().find(|key| key.name == name.get_ref().as_ref()) else {
                let message = format!(
                    "unknown key `{}`: `wasmjob {} --help` lists the flags, and each is a key \
                     with `-` written `_`",
                    name.get_ref(),
                    subcommand.get_name()
                );
                return Err(invalid(name.span(), message));
            };
            let values = values(key, value).map_err(|(span, message)| invalid(span, message))?;
            for value_text in &values {
                check_value(key, value_text).map_err(|message| invalid(value.span(), message))?;
            }
            settings.push(Setting { key: key.clone(), values });
        }
        Ok(ConfigFile { path: path.to_owned(), settings })
    }

    /// Whether the file sets the flag whose clap id is `id`.
    pub fn sets(&self, id: &str) -> bool {
        self.settings.iter().any(|setting| setting.key.id == id)
    }

    /// `root` with the file's values as the defaults of its subcommand `subcommand`'s flags.
    ///
    /// A flag the file sets is no longer required: the file gives it.
    pub fn apply(&self, mut root: Command, subcommand: &str) -> Command {
        for setting in &self.settings {
            let values = setting.values.clone();
            // Hidden from `--help`, which would show a secret as a default.
            let set =
                move |arg: Arg| arg.required(false).default_values(values).hide_default_value(true);
            root = if setting.key.global {
                root.mut_arg(&setting.key.id, set)
            } else {
                root.mut_subcommand(subcommand, |sub| sub.mut_arg(&setting.key.id, set))
            };
        }
        root
    }
}

/// The TOML type `arg`'s values take: integers for the numeric flags, booleans for switches,
/// strings for the rest (addresses, paths and names, parsed by the flag's own parser).
fn kind(arg: &Arg) -> Kind {
    if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        return Kind::Boolean;
    }
    let type_id = arg.get_value_parser().type_id();
    let integers = [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
    ];
    if integers.iter().any(|integer| type_id == *integer) { Kind::Integer } else { Kind::String }
}

fn is_list(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append) || arg.get_value_delimiter().is_some()
}

/// The flag values of `value`, or where and why it is of the wrong type.
fn values(
    key: &Key,
    value: &Spanned<DeValue<'_>>,
) -> Result<Vec<String>, (std::ops::Range<usize>, String)> {
    let scalar = |value: &Spanned<DeValue<'_>>| match (key.kind, value.get_ref()) {
        (Kind::String, DeValue::String(text)) => Some(text.to_string()),
        (Kind::Integer, DeValue::Integer(integer)) => {
            i128::from_str_radix(integer.as_str(), integer.radix()).ok().map(|n| n.to_string())
        }
        (Kind::Boolean, DeValue::Boolean(boolean)) => Some(boolean.to_string()),
        _ => None,
    };
    let expected = match (key.kind, key.list) {
        (Kind::String, false) => "a string",
        (Kind::String, true) => "a string or a list of strings",
        (Kind::Integer, false) => "an integer",
        (Kind::Integer, true) => "an integer or a list of integers",
        (Kind::Boolean, _) => "true or false",
    };
    let wrong = |value: &Spanned<DeValue<'_>>| {
        let message = format!("`{}` takes {expected}, not {}", key.name, type_name(value));
        (value.span(), message)
    };
    match value.get_ref() {
        DeValue::Array(items) if key.list => {
            items.into_iter().map(|item| scalar(item).ok_or_else(|| wrong(item))).collect()
        }
        _ => scalar(value).map(|one| vec![one]).ok_or_else(|| wrong(value)),
    }
}

fn type_name(value: &Spanned<DeValue<'_>>) -> String {
    let name = value.get_ref().type_str();
    match value.get_ref() {
        DeValue::Integer(integer) => format!("{name} {}", integer.as_str()),
        DeValue::Boolean(boolean) => format!("{name} {boolean}"),
        DeValue::String(text) => format!("{name} \"{text}\""),
        _ => name.to_owned(),
    }
}

/// Runs the flag's own parser on `value`, as if it were given on the command line.
fn check_value(key: &Key, value: &str) -> Result<(), String> {
    if key.kind == Kind::Boolean {
        return Ok(());
    }
    // A flag of its own, with the parser alone: the real one may require or exclude others.
    let probe =
        Arg::new("value").long("value").action(ArgAction::Set).value_parser(key.parser.clone());
    let command = Command::new("check").no_binary_name(true).arg(probe);
    let Err(error) = command.try_get_matches_from([format!("--value={value}")]) else {
        return Ok(());
    };
    let reason = match std::error::Error::source(&error) {
        Some(source) => format!(": {source}"),
        None if key.possible.is_empty() => String::new(),
        None => format!(" (possible values: {})", key.possible.join(", ")),
    };
    Err(format!("`{}`: invalid value \"{value}\"{reason}", key.name))
}

/// The line and column (from 1) of byte `offset` in `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..text.floor_char_boundary(offset.min(text.len()))];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |last| last.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use expect_test::{Expect, expect};

    use super::*;
    use crate::cli::Cli;

    fn check(subcommand: &str, text: &str, expected: Expect) {
        let root = Cli::command();
        let sub = root.find_subcommand(subcommand).unwrap();
        let path = Path::new("/etc/wasmjob/admin.toml");
        let out = match ConfigFile::parse(path, text, &root, sub) {
            Ok(file) => file
                .settings
                .iter()
                .map(|setting| format!("{}={:?}", setting.key.name, setting.values))
                .collect::<Vec<_>>()
                .join(" "),
            Err(error) => error.to_string(),
        };
        expected.assert_eq(&out);
    }

    #[test]
    fn keys_and_values_are_checked_with_file_and_line() {
        check(
            "admin",
            r#"
listen = "127.0.0.1:8080"
heartbeat_secs = 0x10
executor_allow = ["10.0.0.0/8", "*.jobs.internal"]
log_format = "json"
admin_token_file = "/run/credentials/admin-token"
smtp_from = "wasmjob <alarms@example.com>"
"#,
            expect![[
                r#"admin_token_file=["/run/credentials/admin-token"] executor_allow=["10.0.0.0/8", "*.jobs.internal"] heartbeat_secs=["16"] listen=["127.0.0.1:8080"] log_format=["json"] smtp_from=["wasmjob <alarms@example.com>"]"#
            ]],
        );
        check(
            "executor",
            "admin_url = \"http://a:8080\"\napp_name = \"billing\"\nmax_concurrent_runs = 8\n",
            expect![[
                r#"admin_url=["http://a:8080"] app_name=["billing"] max_concurrent_runs=["8"]"#
            ]],
        );
        check(
            "admin",
            "listen = \"127.0.0.1:8080\"\nlisen = \"0.0.0.0:8080\"\n",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:2:1: unknown key `lisen`: `wasmjob admin --help` lists the flags, and each is a key with `-` written `_`"#
            ]],
        );
        check(
            "admin",
            "\n\nheartbeat_secs = \"30\"",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:3:18: `heartbeat_secs` takes an integer, not string "30""#
            ]],
        );
        check(
            "admin",
            "listen = 8080",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:1:10: `listen` takes a string, not integer 8080"#
            ]],
        );
        check(
            "admin",
            "listen = \"localhost\"",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:1:10: `listen`: invalid value "localhost": invalid socket address syntax"#
            ]],
        );
        check(
            "admin",
            "heartbeat_secs = -1",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:1:18: `heartbeat_secs`: invalid value "-1": invalid digit found in string"#
            ]],
        );
        check(
            "standalone",
            "log_format = \"xml\"",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:1:14: `log_format`: invalid value "xml" (possible values: text, json)"#
            ]],
        );
        check(
            "admin",
            "executor_allow = [\"10.0.0.0/8\", 10]",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:1:33: `executor_allow` takes a string or a list of strings, not integer 10"#
            ]],
        );
        check(
            "admin",
            "admin_token = [\"a\"]",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:1:15: `admin_token` takes a string, not array"#
            ]],
        );
        // Sections, the file's own flags and another command's flags are no keys.
        check(
            "admin",
            "[tls]\nca_file = \"ca.pem\"",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:1:2: unknown key `tls`: `wasmjob admin --help` lists the flags, and each is a key with `-` written `_`"#
            ]],
        );
        check(
            "admin",
            "print_config = true",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:1:1: unknown key `print_config`: `wasmjob admin --help` lists the flags, and each is a key with `-` written `_`"#
            ]],
        );
        check(
            "executor",
            "database_url = \"sqlite:x.db\"",
            expect![[
                r#"config file /etc/wasmjob/admin.toml:1:1: unknown key `database_url`: `wasmjob executor --help` lists the flags, and each is a key with `-` written `_`"#
            ]],
        );
        check(
            "admin",
            "listen = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:2\"",
            expect!["config file /etc/wasmjob/admin.toml:2:1: duplicate key"],
        );
        check(
            "admin",
            "listen = ",
            expect![
                "config file /etc/wasmjob/admin.toml:1:10: string values must be quoted, expected literal string"
            ],
        );
    }

    #[test]
    fn every_flag_of_a_daemon_is_a_key() {
        let root = Cli::command();
        for name in ["standalone", "admin", "executor"] {
            let sub = root.find_subcommand(name).unwrap();
            let keys: Vec<String> = keys(&root, sub).into_iter().map(|key| key.name).collect();
            let flags = sub.get_arguments().filter_map(Arg::get_long).count();
            // All but --config and --print-config, plus the global --log-format.
            assert_eq!(keys.len(), flags - 2 + 1, "{name}: {keys:?}");
            assert!(keys.contains(&"log_format".to_owned()), "{name}: {keys:?}");
        }
    }
}
