//! The console's two languages, English and Simplified Chinese: which one a request gets, and
//! the catalogs of every text the templates and the script show.
//!
//! The catalogs are `i18n/en.json` and `i18n/zh.json`, flat maps from a key to its text,
//! compiled into the binary. Templates call `t("key")` (with `{name}` placeholders filled from
//! keyword arguments: `t("runs.total", total=n)`); the script gets the keys starting with `js.`
//! as JSON in the page. The tests check both catalogs have the same keys and that every key a
//! template or the script names exists, so a missing translation fails a test, not a page.
//!
//! A request's language is its `lang` cookie when that says `en` or `zh` (the console's
//! switch), else the first of English or Chinese in its `Accept-Language`, else English. This
//! file does not translate what the API says: refusals shown beside a field are the API's own.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::http::HeaderMap;
use axum::http::header::ACCEPT_LANGUAGE;
use minijinja::value::Kwargs;
use minijinja::{Error, State, Value};

use crate::admin::accounts::cookie;

/// The cookie the language switch sets.
pub const LANG_COOKIE: &str = "lang";

/// A language of the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// English, the default.
    En,
    /// Simplified Chinese.
    Zh,
}

impl Lang {
    /// The short name: the cookie's value and the catalog's file name.
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh",
        }
    }

    /// The BCP 47 tag for `<html lang>`.
    pub fn tag(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh-CN",
        }
    }

    fn from_code(code: &str) -> Option<Lang> {
        match code.trim() {
            "en" => Some(Lang::En),
            "zh" => Some(Lang::Zh),
            _ => None,
        }
    }

    /// The language for a request: its `lang` cookie, else its `Accept-Language`.
    pub fn of_request(headers: &HeaderMap) -> Lang {
        if let Some(lang) = cookie(headers, LANG_COOKIE).and_then(Lang::from_code) {
            return lang;
        }
        let accepted = headers.get(ACCEPT_LANGUAGE).and_then(|value| value.to_str().ok());
        accepted.map_or(Lang::En, Lang::negotiate)
    }

    /// The first of English and Chinese in an `Accept-Language` value, by weight and then by
    /// order (`zh`, `zh-CN`, `zh-Hans`, `zh-TW`… are all Chinese); English when it names
    /// neither.
    pub fn negotiate(accept_language: &str) -> Lang {
        let mut best: Option<(f32, Lang)> = None;
        for entry in accept_language.split(',') {
            let mut parts = entry.split(';');
            let tag = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let weight = parts
                .filter_map(|part| part.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            let primary = tag.split('-').next().unwrap_or("");
            let lang = match primary {
                "zh" => Lang::Zh,
                "en" => Lang::En,
                _ => continue,
            };
            if weight > 0.0 && best.is_none_or(|(best_weight, _)| weight > best_weight) {
                best = Some((weight, lang));
            }
        }
        best.map_or(Lang::En, |(_, lang)| lang)
    }
}

/// The text of `key` in `lang`; the key itself when the catalog lacks it (which a test
/// prevents for every key named in a template or the script).
pub fn text(lang: Lang, key: &str) -> String {
    catalog(lang).get(key).cloned().unwrap_or_else(|| key.to_owned())
}

/// The script's texts in `lang` as JSON, safe inside a `<script>` element: the keys starting
/// with `js.` (without that prefix) and the run states (`state.…`, whole).
pub fn script_texts(lang: Lang) -> String {
    let texts: BTreeMap<&str, &str> = catalog(lang)
        .iter()
        .filter_map(|(key, text)| {
            let key =
                key.strip_prefix("js.").or(key.starts_with("state.").then_some(key.as_str()))?;
            Some((key, text.as_str()))
        })
        .collect();
    let json = serde_json::to_string(&texts).unwrap_or_else(|_| "{}".to_owned());
    // Nothing in it can close the element or start markup.
    json.replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026")
}

/// The template function `t(key, **values)`: the text of `key` in the page's language (the
/// render context's `lang`), with each `{name}` replaced by the keyword argument `name`.
pub fn template_text(state: &State<'_, '_>, key: &str, values: Kwargs) -> Result<String, Error> {
    let lang = state
        .lookup("lang")
        .and_then(|lang| lang.as_str().and_then(Lang::from_code))
        .unwrap_or(Lang::En);
    let mut out = text(lang, key);
    for name in values.args() {
        let value: Value = values.get(name)?;
        let shown =
            if value.is_none() || value.is_undefined() { String::new() } else { value.to_string() };
        out = out.replace(&format!("{{{name}}}"), &shown);
    }
    Ok(out)
}

fn catalog(lang: Lang) -> &'static BTreeMap<String, String> {
    static EN: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    static ZH: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    let (cell, source) = match lang {
        Lang::En => (&EN, CATALOGS[0].1),
        Lang::Zh => (&ZH, CATALOGS[1].1),
    };
    cell.get_or_init(|| {
        serde_json::from_str(source).unwrap_or_else(|error| {
            tracing::error!(%error, "the console's {} catalog does not parse", lang.code());
            BTreeMap::new()
        })
    })
}

/// Each catalog's source, by language code.
pub const CATALOGS: [(&str, &str); 2] =
    [("en", include_str!("i18n/en.json")), ("zh", include_str!("i18n/zh.json"))];

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};

    use super::*;

    fn check(accept_language: &[&str], expected: Expect) {
        let out: String = accept_language
            .iter()
            .map(|value| format!("{value:?} -> {}\n", Lang::negotiate(value).code()))
            .collect();
        expected.assert_eq(&out);
    }

    #[test]
    fn accept_language_picks_english_or_chinese() {
        check(
            &[
                "",
                "zh",
                "zh-CN",
                "zh-Hans-CN,zh;q=0.9",
                "ZH-tw",
                "en-US,en;q=0.9,zh-CN;q=0.8",
                "fr-FR,fr;q=0.9,zh;q=0.5,en;q=0.4",
                "en;q=0.2, zh;q=0.8",
                "zh;q=0, en",
                "de",
                "*",
                "zh;q=bogus",
            ],
            expect![[r#"
                "" -> en
                "zh" -> zh
                "zh-CN" -> zh
                "zh-Hans-CN,zh;q=0.9" -> zh
                "ZH-tw" -> zh
                "en-US,en;q=0.9,zh-CN;q=0.8" -> en
                "fr-FR,fr;q=0.9,zh;q=0.5,en;q=0.4" -> zh
                "en;q=0.2, zh;q=0.8" -> zh
                "zh;q=0, en" -> en
                "de" -> en
                "*" -> en
                "zh;q=bogus" -> zh
            "#]],
        );
    }

    #[test]
    fn the_lang_cookie_wins_over_the_header() {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT_LANGUAGE, "zh-CN,zh;q=0.9".parse().unwrap());
        assert_eq!(Lang::of_request(&headers), Lang::Zh);
        headers.insert(axum::http::header::COOKIE, "a=b; lang=en".parse().unwrap());
        assert_eq!(Lang::of_request(&headers), Lang::En);
        headers.insert(axum::http::header::COOKIE, "lang=xx".parse().unwrap());
        assert_eq!(Lang::of_request(&headers), Lang::Zh, "an unknown cookie value is ignored");
    }

    /// The keys named as `t("...")` in `source`; a key ending in `.` is a prefix completed at
    /// render time (`t("state." ~ run.state)`).
    fn keys_named(source: &str) -> Vec<String> {
        source
            .match_indices("t(\"")
            .filter(|(at, _)| {
                // `t(` itself, not the end of `split(` or `.at(`.
                let before = source[..*at].chars().next_back().unwrap_or(' ');
                !(before.is_alphanumeric() || before == '_' || before == '.')
            })
            .filter_map(|(at, _)| source[at + 3..].split_once('"').map(|(key, _)| key.to_owned()))
            .collect()
    }

    #[test]
    fn every_key_a_template_or_the_script_names_has_a_text_in_both_languages() {
        use super::super::job_form::{Input, sections};
        use crate::model::{AddressType, RunState, TriggerType};
        let mut prefixes = Vec::new();
        let mut keys = Vec::new();
        for (name, source) in super::super::pages::TEMPLATES {
            for key in keys_named(source) {
                if key.ends_with('.') {
                    prefixes.push(key);
                } else {
                    keys.push((name.to_string(), key));
                }
            }
        }
        let script = include_str!("assets/console.js");
        for key in keys_named(script).into_iter().filter(|key| key != "key") {
            keys.push(("console.js".to_owned(), format!("js.{key}")));
        }
        assert!(keys.len() > 150, "the templates name {} keys", keys.len());
        // The keys completed at render time, with every value they can be completed with.
        let form = sections();
        let fields: Vec<&str> = form.iter().flat_map(|s| s.fields.iter().map(|f| f.name)).collect();
        let completed: &[(&str, Vec<&str>)] = &[
            ("state.", RunState::ALL.iter().map(|v| v.as_str()).collect()),
            ("trigger.", TriggerType::ALL.iter().map(|v| v.as_str()).collect()),
            ("address_type.", AddressType::ALL.iter().map(|v| v.as_str()).collect()),
            ("role.", vec!["admin", "operator", "viewer"]),
            ("executors.mode.", vec!["push", "pull"]),
            ("job_section.", form.iter().map(|section| section.key).collect()),
            ("field.", fields.clone()),
            ("help.", fields),
            (
                "backfill.state.",
                crate::backfill::BackfillState::ALL.iter().map(|v| v.as_str()).collect(),
            ),
            (
                "workflow_run.state.",
                crate::workflow::RunState::ALL.iter().map(|v| v.as_str()).collect(),
            ),
            ("node.state.", {
                let mut states: Vec<&str> =
                    crate::workflow::NodeState::ALL.iter().map(|v| v.as_str()).collect();
                states.push("starting");
                states
            }),
        ];
        // The job form's choices are labeled by key: each value of each choice.
        for field in form.iter().flat_map(|section| &section.fields) {
            if let Input::Choice { values, labels: Some(prefix) } = &field.input {
                for value in values {
                    keys.push((format!("choice {}", field.name), format!("{prefix}{value}")));
                }
            }
        }
        for prefix in &prefixes {
            let values = completed.iter().find(|(known, _)| known == prefix);
            let (_, values) = values.unwrap_or_else(|| panic!("unknown key prefix {prefix}"));
            for value in values {
                keys.push(("(completed)".to_owned(), format!("{prefix}{value}")));
            }
        }
        // The keys named from Rust: page errors and login refusals.
        let rust = [
            include_str!("../console.rs"),
            include_str!("pages.rs"),
            include_str!("workflow_pages.rs"),
        ];
        for source in rust {
            for key in source.split('"').filter(|text| {
                ["error.", "login.", "runs."].iter().any(|prefix| text.starts_with(prefix))
                    && !text.ends_with(".html")
                    && !text.contains(' ')
            }) {
                keys.push(("(rust)".to_owned(), key.to_owned()));
            }
        }
        for lang in [Lang::En, Lang::Zh] {
            let missing: Vec<&(String, String)> =
                keys.iter().filter(|(_, key)| !catalog(lang).contains_key(key)).collect();
            assert!(missing.is_empty(), "{} catalog lacks {missing:?}", lang.code());
        }
    }

    #[test]
    fn both_catalogs_parse_and_have_the_same_keys() {
        let en: BTreeMap<String, String> = serde_json::from_str(CATALOGS[0].1).unwrap();
        let zh: BTreeMap<String, String> = serde_json::from_str(CATALOGS[1].1).unwrap();
        let only_en: Vec<&String> = en.keys().filter(|key| !zh.contains_key(*key)).collect();
        let only_zh: Vec<&String> = zh.keys().filter(|key| !en.contains_key(*key)).collect();
        assert!(
            only_en.is_empty() && only_zh.is_empty(),
            "only en: {only_en:?}, only zh: {only_zh:?}"
        );
        for (key, text) in en.iter().chain(zh.iter()) {
            assert!(!text.trim().is_empty(), "{key} has an empty text");
        }
        // The same placeholders in both languages.
        let placeholders = |text: &str| {
            let mut names: Vec<String> = text
                .split('{')
                .skip(1)
                .filter_map(|rest| rest.split_once('}').map(|(name, _)| name.to_owned()))
                .collect();
            names.sort();
            names
        };
        for (key, text) in &en {
            assert_eq!(placeholders(text), placeholders(&zh[key]), "{key}: placeholders differ");
        }
    }
}
