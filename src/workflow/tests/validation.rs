//! What [`validate`] refuses, with its message, and the graph it returns; the JSON document.

use std::fmt::Write as _;

use expect_test::expect;

use super::*;

/// Jobs 1 to 9 are in group 1, job 10 in group 7, and no other job exists.
fn job_group(job_id: i64) -> Option<i64> {
    match job_id {
        1..=9 => Some(1),
        10 => Some(7),
        _ => None,
    }
}

fn with_node_name(mut spec: WorkflowSpec, index: usize, name: &str) -> WorkflowSpec {
    spec.nodes[index].name = name.to_owned();
    spec
}

fn with_job(mut spec: WorkflowSpec, index: usize, job_id: i64) -> WorkflowSpec {
    spec.nodes[index].job_id = job_id;
    spec
}

fn many_nodes(count: usize) -> WorkflowSpec {
    let names: Vec<String> = (0..count).map(|index| format!("n{index}")).collect();
    let mut spec = spec(&names.join(" "), &[]);
    for node in &mut spec.nodes {
        node.job_id = 1;
    }
    spec
}

#[test]
fn refusals() {
    let cases: Vec<(&str, WorkflowSpec)> = vec![
        ("no nodes", spec("", &[])),
        ("too many nodes", many_nodes(MAX_NODES + 1)),
        ("an empty name", with_node_name(spec("a b", &[]), 1, "")),
        ("a blank name", with_node_name(spec("a b", &[]), 0, " \t")),
        ("a long name", with_node_name(spec("a b", &[]), 1, &"long".repeat(51))),
        ("a name twice", spec("a b a", &[])),
        ("an unknown upstream", spec("a b", &["a -> b", "z -> b"])),
        ("an unknown downstream", spec("a b", &["a -> b", "b -> z"])),
        ("a self edge", spec("a b", &["a -> b", "b -> b always"])),
        ("an edge twice", spec("a b", &["a -> b", "a -> b on_failure"])),
        ("an unknown job", with_job(spec("a b", &["a -> b"]), 1, 404)),
        ("a job of another group", with_job(spec("a b", &["a -> b"]), 0, 10)),
        ("a cycle of two", spec("a b", &["a -> b", "b -> a"])),
        ("a cycle behind a root", spec("r a b c", &["r -> a", "a -> b", "b -> c", "c -> a"])),
        (
            "two cycles: the one met first from the spec's first node",
            spec("a b c d e", &["d -> e", "e -> d", "a -> b", "b -> c", "c -> b", "a -> d"]),
        ),
    ];
    let mut out = String::new();
    for (label, spec) in cases {
        let error = validate(&spec, job_group).unwrap_err();
        writeln!(out, "{label}: {error}").unwrap();
    }
    expect![[r#"
        no nodes: a workflow needs at least one node
        too many nodes: the workflow has 201 nodes, more than the limit of 200
        an empty name: nodes[1] has an empty name
        a blank name: nodes[0] has an empty name
        a long name: nodes[1]'s name `longlonglonglonglonglong…` is 204 characters long, more than the limit of 200
        a name twice: two nodes are named `a`
        an unknown upstream: the edge from `z` to `b` names `z`, which is no node of the workflow
        an unknown downstream: the edge from `b` to `z` names `z`, which is no node of the workflow
        a self edge: the edge from `b` to itself would make it wait for itself
        an edge twice: the edge from `a` to `b` is given twice (use `always` for both ends)
        an unknown job: node `b` runs job 404, which does not exist
        a job of another group: node `a` runs job 10 of group 7, not of the workflow's group 1
        a cycle of two: the edges form a cycle: a → b → a
        a cycle behind a root: the edges form a cycle: a → b → c → a
        two cycles: the one met first from the spec's first node: the edges form a cycle: b → c → b
    "#]].assert_eq(&out);
}

#[test]
fn limits_are_inclusive_and_names_count_characters() {
    assert!(validate(&many_nodes(MAX_NODES), job_group).is_ok());
    let long = "é".repeat(MAX_NAME_CHARS);
    let graph = validate(&with_node_name(spec("a b", &[]), 0, &long), job_group).unwrap();
    assert_eq!(graph.node(&long), Some(0));
}

#[test]
fn a_cycle_no_root_reaches_is_refused_as_a_cycle() {
    // r is a root; x and y wait for each other and no root reaches them. This is the only way
    // for a node to lack a path from a root, and the cycle check catches it.
    let spec = spec("r x y", &["x -> y", "y -> x"]);
    expect!["the edges form a cycle: x → y → x"]
        .assert_eq(&validate(&spec, job_group).unwrap_err().to_string());
}

/// Every node of an acyclic graph has a path from a root, so `validate` needs no check for it:
/// here over graphs of every density, from a small deterministic generator.
#[test]
fn every_node_of_a_valid_graph_has_a_path_from_a_root() {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        seed >> 33
    };
    for case in 0..200 {
        let count = 1 + (next() % 40) as usize;
        let density = next() % 100;
        // Edges go from a lower to a higher position in a shuffled order, so the graph is
        // acyclic and its roots are anywhere in the spec.
        let mut order: Vec<usize> = (0..count).collect();
        for index in (1..count).rev() {
            order.swap(index, (next() % (index as u64 + 1)) as usize);
        }
        let names: Vec<String> = (0..count).map(|index| format!("n{index}")).collect();
        let mut edges = Vec::new();
        for low in 0..count {
            for high in low + 1..count {
                if next() % 100 < density {
                    edges.push(format!("n{} -> n{}", order[low], order[high]));
                }
            }
        }
        let edges: Vec<&str> = edges.iter().map(String::as_str).collect();
        let graph = validate(&spec(&names.join(" "), &edges), |_| Some(1)).unwrap();
        let mut reached = vec![false; count];
        let mut stack: Vec<usize> = graph.roots().collect();
        while let Some(index) = stack.pop() {
            if !std::mem::replace(&mut reached[index], true) {
                stack.extend(graph.downstream(index));
            }
        }
        assert!(reached.iter().all(|&reached| reached), "case {case}: {edges:?}");
    }
}

#[test]
fn a_three_level_dag_with_a_sharded_middle_node() {
    // `transform` runs a sharded job; its shards are the runs' business, not the graph's.
    let mut spec = spec(
        "extract dictionary transform load alert",
        &[
            "extract -> transform",
            "dictionary -> transform",
            "transform -> load",
            "transform -> alert on_failure",
            "extract -> alert on_failure",
        ],
    );
    spec.nodes[2].param = Some("{\"shards\": 4}".to_owned());
    let graph = validate(&spec, job_group).unwrap();
    let mut out = format!("roots: {}\n", names(&graph, graph.roots()));
    for (index, node) in graph.nodes().iter().enumerate() {
        assert_eq!(graph.node(&node.name), Some(index));
        let outgoing: Vec<String> = graph
            .outgoing(index)
            .iter()
            .map(|edge| format!("{} {}", edge.condition, graph.nodes()[edge.to].name))
            .collect();
        writeln!(
            out,
            "{index} {} (job {}): upstream {}; downstream {}; out [{}]",
            node.name,
            node.job_id,
            names(&graph, graph.upstream(index)),
            names(&graph, graph.downstream(index)),
            outgoing.join(", "),
        )
        .unwrap();
    }
    expect![[r#"
        roots: extract dictionary
        0 extract (job 1): upstream -; downstream transform alert; out [on_success transform, on_failure alert]
        1 dictionary (job 2): upstream -; downstream transform; out [on_success transform]
        2 transform (job 3): upstream extract dictionary; downstream load alert; out [on_success load, on_failure alert]
        3 load (job 4): upstream transform; downstream -; out []
        4 alert (job 5): upstream extract transform; downstream -; out []
    "#]].assert_eq(&out);
    assert_eq!((graph.name(), graph.group_id(), graph.node("nothing")), ("test", 1, None));
    assert_eq!(graph.nodes()[2].param.as_deref(), Some("{\"shards\": 4}"));
}

#[test]
fn the_json_document() {
    let text = r#"{
        "name": "nightly",
        "group_id": 1,
        "nodes": [
            {"name": "extract", "job_id": 1},
            {"name": "load", "job_id": 2, "param": "full", "pass_inputs": false},
            {"name": "alert", "job_id": 3}
        ],
        "edges": [
            {"from": "extract", "to": "load"},
            {"from": "extract", "to": "alert", "condition": "on_failure"}
        ]
    }"#;
    let spec: WorkflowSpec = serde_json::from_str(text).unwrap();
    assert!(spec.nodes[0].pass_inputs && !spec.nodes[1].pass_inputs);
    assert_eq!(spec.nodes[1].param.as_deref(), Some("full"));
    assert_eq!(spec.edges[0].condition, Condition::OnSuccess);
    assert_eq!(spec.edges[1].condition, Condition::OnFailure);
    let again: WorkflowSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
    assert_eq!(again, spec);
    assert!(validate(&spec, job_group).is_ok());

    let refused = [
        text.replace("\"on_failure\"", "\"onFailure\""),
        text.replace("\"pass_inputs\"", "\"pass_input\""),
        text.replace("\"group_id\"", "\"group\""),
    ];
    let errors: Vec<String> = refused
        .iter()
        .map(|text| serde_json::from_str::<WorkflowSpec>(text).unwrap_err().to_string())
        .collect();
    expect![[r#"
        unknown variant `onFailure`, expected one of `on_success`, `on_failure`, `always` at line 11 column 71
        unknown field `pass_input`, expected one of `name`, `job_id`, `param`, `pass_inputs` at line 6 column 71
        unknown field `group`, expected one of `name`, `group_id`, `nodes`, `edges` at line 3 column 15"#]].assert_eq(&errors.join("\n"));
}
