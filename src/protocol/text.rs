//! How a peer's text and a call's errors are shown: a peer's text only as a short, printable
//! excerpt, an error with its causes on one line, and the URL a call went to.

/// The most characters of a peer's text shown in an error.
pub const EXCERPT_CHARS: usize = 100;

/// A peer's text as it may be shown to an operator: control characters dropped, at most
/// [`EXCERPT_CHARS`] characters, and `…` when it was cut.
pub fn excerpt(text: &str) -> String {
    let mut shown = text.chars().filter(|c| !c.is_control() && !is_invisible(*c));
    let mut kept: String = shown.by_ref().take(EXCERPT_CHARS).collect();
    if shown.next().is_some() {
        kept.push('…');
    }
    kept
}

/// Format characters that reorder or hide text (bidirectional overrides, zero-width marks).
fn is_invisible(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// An error and its causes on one line (an HTTP client's own message omits them: "error
/// sending request" says nothing of a refused connection or a refused address).
pub(super) fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Joins a base URL and a path with exactly one slash.
pub fn join_url(base: &str, path: &str) -> String {
    JoinedUrl(base, path).to_string()
}

/// `path` under `base`, as [`join_url`] writes it, written only when shown.
pub(super) struct JoinedUrl<'a>(pub(super) &'a str, pub(super) &'a str);

impl std::fmt::Display for JoinedUrl<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.0.trim_end_matches('/'), self.1.trim_start_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_short_and_printable() {
        let table = [
            ("plain", "plain"),
            ("line\nbreak\r\ttab\u{1b}[31mred\u{0}", "linebreaktab[31mred"),
            ("a\u{202e}desrever\u{200b}", "adesrever"),
        ];
        for (text, expected) in table {
            assert_eq!(excerpt(text), expected, "{text:?}");
        }
        let long = "é".repeat(500);
        let cut = excerpt(&long);
        assert_eq!(cut.chars().count(), EXCERPT_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(excerpt(&"x".repeat(EXCERPT_CHARS)), "x".repeat(EXCERPT_CHARS));
    }
}
