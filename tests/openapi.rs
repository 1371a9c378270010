//! `GET /api/v1/openapi.json` through the router: an OpenAPI 3.1 document that lists exactly the
//! routes the router serves (read from the handlers' `.route(..)` calls), each answered by the
//! router, each with its error statuses and the one error body.
//!
//! What the live API answers is checked against this document by schemathesis in `.ci/run`
//! (`.ci/schemathesis`), not here.

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use wasmjob::admin::{AppState, router};
use wasmjob::storage::Db;

use crate::support::ADMIN_TOKEN;

/// The methods an axum route can be given.
const METHODS: &[&str] = &["get", "post", "put", "delete", "patch"];

/// Files of `src/admin/http/` whose routes are not the operator API's.
const NOT_OPERATOR: &[&str] = &["executor_api.rs"];

/// Files of `src/admin/http/` routed at the root rather than under `/api/v1`.
const AT_ROOT: &[&str] = &["metrics.rs", "health.rs"];

/// The routes that take no credentials: the probes.
const PUBLIC: &[&str] = &["/healthz", "/readyz"];

async fn send(
    app: &axum::Router,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// `(method, path)` of every route the operator API's handlers register, from their source.
fn routed() -> BTreeSet<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/admin/http");
    let mut routes = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !file.ends_with(".rs") || NOT_OPERATOR.contains(&file.as_str()) {
            continue;
        }
        let prefix = if AT_ROOT.contains(&file.as_str()) { "" } else { "/api/v1" };
        let source = std::fs::read_to_string(&path).unwrap();
        for (route, methods) in route_calls(&source) {
            assert!(!methods.is_empty(), "{file}: no method found for {route}");
            for method in methods {
                routes.insert((method.to_uppercase(), format!("{prefix}{route}")));
            }
        }
    }
    routes
}

/// The `.route("/path", get(..).post(..))` calls in `source`: each path with its methods.
fn route_calls(source: &str) -> Vec<(String, Vec<String>)> {
    let mut calls = Vec::new();
    for (start, _) in source.match_indices(".route(") {
        let rest = source[start + ".route(".len()..].trim_start();
        let Some(rest) = rest.strip_prefix('"') else { continue };
        let route = rest.split('"').next().unwrap().to_owned();
        // The call's arguments run to the parenthesis that closes `.route(`.
        let mut depth = 1;
        let mut end = rest.len();
        for (index, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = index;
                break;
            }
        }
        let arguments = &rest[..end];
        let mut methods = Vec::new();
        for (index, _) in arguments.char_indices() {
            let before = arguments[..index].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            for method in METHODS {
                if arguments[index..].starts_with(&format!("{method}(")) {
                    methods.push((*method).to_owned());
                }
            }
        }
        calls.push((route, methods));
    }
    calls
}

#[test]
fn route_calls_are_read_from_the_source() {
    let source = r#"
        Router::new()
            .route("/a", get(list_a).post(create_a))
            .route(
                "/a/{id}/b",
                get(get_b)
                    .layer(DefaultBodyLimit::max(state.config.max_module_bytes)),
            )
            .route("/c/{id}", delete(delete_c))
            .route("/d", axum::routing::put(forget_d))
    "#;
    let calls: Vec<String> = route_calls(source)
        .into_iter()
        .map(|(route, methods)| format!("{route} {}", methods.join(",")))
        .collect();
    assert_eq!(calls, ["/a get,post", "/a/{id}/b get", "/c/{id} delete", "/d put"]);
}

#[tokio::test]
async fn the_document_describes_every_route_the_router_serves() {
    wasmjob::telemetry::init_for_test();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("openapi.db").display());
    let db = Db::connect(&url).await.unwrap();
    let app = router(AppState::new(db, crate::support::app::admin_config(url)).unwrap());

    let (status, _) = send(&app, "GET", "/api/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the document is for callers of the API");
    let (status, document) = send(&app, "GET", "/api/v1/openapi.json", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    let version = document["openapi"].as_str().unwrap();
    assert!(version.starts_with("3.1."), "{version}");
    assert_eq!(document["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");

    // The same routes both ways.
    let paths = document["paths"].as_object().unwrap();
    let mut documented = BTreeSet::new();
    for (path, item) in paths {
        for method in METHODS {
            if item.get(*method).is_some() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let routed = routed();
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    assert!(undocumented.is_empty(), "routed but not in the document: {undocumented:?}");
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(unrouted.is_empty(), "in the document but not routed: {unrouted:?}");
    assert!(documented.len() >= 30, "{documented:?}");

    for (method, path) in &documented {
        let operation = &paths[path][method.to_lowercase()];
        let responses = operation["responses"].as_object().unwrap();
        let statuses: Vec<&str> = responses.keys().map(String::as_str).collect();
        let what = format!("{method} {path}: {statuses:?}");

        // Every route but the probes is behind authentication; every change may be refused
        // (role or CSRF); every path parameter may be malformed.
        if PUBLIC.contains(&path.as_str()) {
            assert_eq!(operation["security"], serde_json::json!([{}]), "{what}: no credentials");
            let (status, _) = send(&app, method, path, None).await;
            assert_ne!(status, StatusCode::UNAUTHORIZED, "{what}: answered without credentials");
            continue;
        }
        assert!(statuses.contains(&"401"), "{what}");
        if method != "GET" {
            assert!(statuses.contains(&"403"), "{what}");
        }
        if path.contains('{') {
            assert!(statuses.contains(&"400"), "{what}");
        }
        assert!(statuses.iter().any(|status| status.starts_with('2')), "{what}");
        for (status, response) in responses {
            if status.starts_with('4') || status.starts_with('5') {
                let schema = &response["content"]["application/json"]["schema"]["$ref"];
                assert_eq!(schema, "#/components/schemas/ErrorBody", "{what}: {status}");
            }
        }

        // The router answers it: neither "no such route" nor "no such method".
        let concrete = path.replace("{id}", "1").replace("{version}", "1");
        let (status, body) = send(&app, method, &concrete, Some(ADMIN_TOKEN)).await;
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {concrete}");
        assert_ne!(body["code"], "route_not_found", "{method} {concrete}");
    }
    let error = &document["components"]["schemas"]["ErrorBody"];
    assert_eq!(error["required"], serde_json::json!(["code", "message"]));
}
