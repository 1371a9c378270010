//! A workflow's graph drawn as SVG on the server: each node a box in the column of its depth
//! (the longest path to it from a root), the nodes of a column in the workflow's order, each
//! edge an arrow, labelled when its condition is not `on_success`. A box's class names its
//! node's state, for the stylesheet to colour, and a box may link to the node's run.

use std::fmt::Write as _;

use crate::workflow::{Condition, Graph};

const BOX_WIDTH: usize = 150;
const BOX_HEIGHT: usize = 34;
const COLUMN: usize = 200;
const ROW: usize = 54;
const MARGIN: usize = 16;
/// How many characters of a node's name its box shows.
const NAME_CHARS: usize = 20;

/// One node as drawn: its state's class (`waiting`, `running`, …) and where its box links.
#[derive(Debug, Clone, Default)]
pub struct Look {
    pub state: Option<String>,
    pub link: Option<String>,
}

/// The SVG of `graph`, node `i` looking as `looks[i]` says (plain when absent).
pub fn svg(graph: &Graph, looks: &[Look], label: &str) -> String {
    let count = graph.node_count();
    let mut depth = vec![None; count];
    for index in 0..count {
        depth_of(graph, index, &mut depth);
    }
    let depth: Vec<usize> = depth.into_iter().map(Option::unwrap_or_default).collect();
    let mut row = vec![0; count];
    let mut rows_in = vec![0; depth.iter().max().map_or(0, |deepest| deepest + 1)];
    for index in 0..count {
        row[index] = rows_in[depth[index]];
        rows_in[depth[index]] += 1;
    }
    let at = |index: usize| (MARGIN + depth[index] * COLUMN, MARGIN + row[index] * ROW);
    let width = 2 * MARGIN + (rows_in.len().max(1) - 1) * COLUMN + BOX_WIDTH;
    let height =
        2 * MARGIN + (rows_in.iter().max().copied().unwrap_or(1).max(1) - 1) * ROW + BOX_HEIGHT;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg class="dag" role="img" aria-label="{}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">"#,
        escape(label)
    );
    out.push_str(r#"<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"/></marker></defs>"#);
    for index in 0..count {
        for edge in graph.outgoing(index) {
            let (x1, y1) = at(edge.from);
            let (x2, y2) = at(edge.to);
            let (x1, y1, x2, y2) = (x1 + BOX_WIDTH, y1 + BOX_HEIGHT / 2, x2, y2 + BOX_HEIGHT / 2);
            let class = edge.condition.as_str();
            let _ = write!(
                out,
                r#"<line class="edge edge-{class}" x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" marker-end="url(#arrow)"/>"#
            );
            if edge.condition != Condition::OnSuccess {
                let (x, y) = ((x1 + x2) / 2, (y1 + y2) / 2 - 4);
                let _ = write!(out, r#"<text class="edge-label" x="{x}" y="{y}">{class}</text>"#);
            }
        }
    }
    for (index, node) in graph.nodes().iter().enumerate() {
        let (x, y) = at(index);
        let look = looks.get(index).cloned().unwrap_or_default();
        let state = look.state.as_deref().unwrap_or("plain");
        let name: String = node.name.chars().take(NAME_CHARS).collect();
        let shown =
            if node.name.chars().count() > NAME_CHARS { format!("{name}…") } else { name };
        let mut shape = format!(
            r#"<g class="node node-{state}"><title>{} ({state})</title><rect x="{x}" y="{y}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" rx="4"/><text x="{}" y="{}">{}</text></g>"#,
            escape(&node.name),
            x + 8,
            y + BOX_HEIGHT / 2 + 5,
            escape(&shown)
        );
        if let Some(link) = &look.link {
            shape = format!(r#"<a href="{}">{shape}</a>"#, escape(link));
        }
        out.push_str(&shape);
    }
    out.push_str("</svg>");
    out
}

/// Node `index`'s depth, computing its upstream nodes' first (the graph has no cycle).
fn depth_of(graph: &Graph, index: usize, depth: &mut [Option<usize>]) -> usize {
    if let Some(known) = depth[index] {
        return known;
    }
    let upstream: Vec<usize> = graph.upstream(index).collect();
    let deepest = upstream.into_iter().map(|from| depth_of(graph, from, depth) + 1).max();
    let value = deepest.unwrap_or(0);
    depth[index] = Some(value);
    value
}

/// `text` safe inside SVG text and attribute values.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::{EdgeSpec, NodeSpec, WorkflowSpec, validate};

    #[test]
    fn nodes_stand_in_columns_by_depth_and_names_are_escaped() {
        let node = |name: &str| NodeSpec {
            name: name.to_owned(),
            job_id: 1,
            param: None,
            pass_inputs: true,
        };
        let edge = |from: &str, to: &str, condition| EdgeSpec {
            from: from.to_owned(),
            to: to.to_owned(),
            condition,
        };
        let spec = WorkflowSpec {
            name: "w".to_owned(),
            group_id: 1,
            nodes: vec![node("a<b"), node("c"), node("d")],
            edges: vec![
                edge("a<b", "c", Condition::OnSuccess),
                edge("c", "d", Condition::Always),
                edge("a<b", "d", Condition::OnFailure),
            ],
        };
        let graph = validate(&spec, |_| Some(1)).unwrap();
        let looks = [
            Look { state: Some("succeeded".to_owned()), link: Some("/runs/1".to_owned()) },
            Look::default(),
            Look { state: Some("running".to_owned()), link: None },
        ];
        let drawn = svg(&graph, &looks, "graph of w");
        assert!(drawn.contains(r#"<g class="node node-succeeded"><title>a&lt;b (succeeded)</title><rect x="16" y="16""#), "{drawn}");
        assert!(drawn.contains(r#"<a href="/runs/1">"#), "{drawn}");
        assert!(
            drawn.contains(
                r#"<g class="node node-plain"><title>c (plain)</title><rect x="216" y="16""#
            ),
            "{drawn}"
        );
        assert!(drawn.contains(r#"<rect x="416" y="16""#), "d is two deep: {drawn}");
        assert!(
            drawn.contains(">always</text>") && drawn.contains(">on_failure</text>"),
            "{drawn}"
        );
        assert!(!drawn.contains("a<b"), "escaped: {drawn}");
    }
}
