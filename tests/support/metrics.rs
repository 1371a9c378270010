//! `/metrics` scraped and parsed strictly as the OpenMetrics text format.

use std::collections::{BTreeMap, HashMap};

use reqwest::StatusCode;

use super::ACCESS_TOKEN;

/// A parsed exposition: each sample (`name{labels}` with labels sorted) and its value.
#[derive(Debug)]
pub struct Scrape {
    pub samples: HashMap<String, f64>,
    pub types: HashMap<String, String>,
}

impl Scrape {
    /// The value of `series` (`name` or `name{k="v"}`), 0 when absent.
    pub fn value(&self, series: &str) -> f64 {
        self.samples.get(series).copied().unwrap_or(0.0)
    }
}

/// Parses the OpenMetrics text format, panicking on anything it does not allow: metadata
/// before the samples of its family, a known type for every family, `_total` on counter
/// samples, well-formed names, labels and values, cumulative histogram buckets, `# EOF` last.
pub fn parse(text: &str) -> Scrape {
    let mut scrape = Scrape { samples: HashMap::new(), types: HashMap::new() };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the exposition ends with # EOF");
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for line in &lines[..lines.len() - 1] {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (kind, name, rest) =
                (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap_or(""));
            assert!(is_name(name), "bad metric name in {line:?}");
            match kind {
                "HELP" | "UNIT" => {}
                "TYPE" => {
                    assert!(
                        ["counter", "gauge", "histogram", "info", "stateset", "unknown"]
                            .contains(&rest),
                        "bad type in {line:?}"
                    );
                    let known = scrape.types.insert(name.to_owned(), rest.to_owned());
                    assert!(known.is_none(), "{name} typed twice");
                }
                other => panic!("unknown metadata {other:?} in {line:?}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            number => number.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').unwrap_or_else(|| panic!("{line:?}"));
                (name, parse_labels(labels, line))
            }
            None => (series, Vec::new()),
        };
        assert!(is_name(name), "bad sample name in {line:?}");
        let family = scrape
            .types
            .iter()
            .filter(|(family, _)| name.starts_with(family.as_str()))
            .max_by_key(|(family, _)| family.len())
            .map(|(family, kind)| (family.clone(), kind.clone()))
            .unwrap_or_else(|| panic!("sample before its family's TYPE: {line:?}"));
        let suffix = &name[family.0.len()..];
        let allowed: &[&str] = match family.1.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            _ => &[""],
        };
        assert!(allowed.contains(&suffix), "{name} does not fit a {} family", family.1);
        if suffix == "_bucket" {
            let le = labels.iter().find(|(key, _)| key == "le").expect("a bucket has le");
            let bound = if le.1 == "+Inf" { f64::INFINITY } else { le.1.parse().unwrap() };
            let others: Vec<_> = labels.iter().filter(|(key, _)| key != "le").collect();
            buckets.entry(format!("{name}{others:?}")).or_default().push((bound, value));
        }
        let mut labels = labels;
        labels.sort();
        let key = if labels.is_empty() {
            name.to_owned()
        } else {
            let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            format!("{name}{{{}}}", inner.join(","))
        };
        assert!(scrape.samples.insert(key, value).is_none(), "sample twice: {line:?}");
    }
    for (histogram, bounds) in buckets {
        let ordered = bounds.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1);
        assert!(ordered, "{histogram}: buckets not cumulative: {bounds:?}");
        assert_eq!(bounds.last().map(|b| b.0), Some(f64::INFINITY), "{histogram} lacks +Inf");
    }
    scrape
}

pub async fn scrape_executor(http: &reqwest::Client, url: &str) -> Scrape {
    let reply = http.get(format!("{url}/metrics")).bearer_auth(ACCESS_TOKEN).send().await.unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    parse(&reply.text().await.unwrap())
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_labels(text: &str, line: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("bad labels: {line:?}"));
        assert!(is_name(key), "bad label name in {line:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => panic!("bad escape in {line:?}"),
                },
                Some((at, '"')) => break at,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {line:?}"),
            }
        };
        labels.push((key.to_owned(), value));
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    labels
}
