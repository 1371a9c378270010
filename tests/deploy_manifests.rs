//! The Kubernetes manifests in `deploy/kubernetes/`: each document is a Kubernetes API object
//! that the API server would take as written, and together they are the documented topology.
//!
//! `k8s-openapi`'s types skip fields they do not know when deserializing, so a misspelt field
//! (`readinesProbe`) would pass a plain parse and be dropped by the API server. The check here
//! deserializes each document into its type, serializes that back, and requires the two to be
//! the same JSON: a field the type does not know, or a value of another shape, is a difference,
//! reported with its path. The table `the_check_refuses` shows the check failing on such
//! documents.
//!
//! This does not start a cluster: no server-side validation (admission, quotas, image pulls).

use std::path::{Path, PathBuf};

use k8s_openapi::Resource;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplateSpec, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One manifest document, typed.
#[derive(Debug)]
enum Object {
    ConfigMap(Box<ConfigMap>),
    Deployment(Box<Deployment>),
    PodDisruptionBudget(Box<PodDisruptionBudget>),
    Secret(Box<Secret>),
    Service(Box<Service>),
    StatefulSet(Box<StatefulSet>),
}

/// Deserializes `document` as `T` and requires its re-serialization to equal it.
fn exact<T: DeserializeOwned + Serialize>(document: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(document.clone()).map_err(|error| error.to_string())?;
    let again = serde_json::to_value(&typed).map_err(|error| error.to_string())?;
    match first_difference(document, &again, "") {
        None => Ok(typed),
        Some(path) => {
            Err(format!("`{path}` is not read as written by {}", std::any::type_name::<T>()))
        }
    }
}

/// The path of the first place where `a` and `b` differ, if any.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let keys = a.keys().chain(b.keys().filter(|key| !a.contains_key(*key)));
            keys.into_iter().find_map(|key| match (a.get(key), b.get(key)) {
                (Some(x), Some(y)) => first_difference(x, y, &format!("{path}.{key}")),
                _ => Some(format!("{path}.{key}")),
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(index, (x, y))| first_difference(x, y, &format!("{path}[{index}]"))),
        _ if a == b => None,
        _ => Some(if path.is_empty() { ".".to_owned() } else { path.to_owned() }),
    }
}

/// Checks one document against the type its `apiVersion` and `kind` name.
fn check(document: &Value) -> Result<Object, String> {
    let api_version = document["apiVersion"].as_str().unwrap_or_default();
    let kind = document["kind"].as_str().unwrap_or_default();
    macro_rules! typed {
        ($($variant:ident => $type:ty, $wrap:expr;)*) => {
            $(if (api_version, kind) == (<$type>::API_VERSION, <$type>::KIND) {
                return exact::<$type>(document).map($wrap);
            })*
        };
    }
    typed! {
        ConfigMap => ConfigMap, |o| Object::ConfigMap(Box::new(o));
        Deployment => Deployment, |o| Object::Deployment(Box::new(o));
        PodDisruptionBudget => PodDisruptionBudget, |o| Object::PodDisruptionBudget(Box::new(o));
        Secret => Secret, |o| Object::Secret(Box::new(o));
        Service => Service, |o| Object::Service(Box::new(o));
        StatefulSet => StatefulSet, |o| Object::StatefulSet(Box::new(o));
    }
    Err(format!("`{api_version}` `{kind}` is not a kind these manifests use"))
}

/// Every document of a YAML text (`---`-separated), as JSON.
fn documents(text: &str) -> Result<Vec<Value>, String> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|document| {
            let value: Value =
                serde::Deserialize::deserialize(document).map_err(|e| e.to_string())?;
            Ok(value)
        })
        .filter(|document| !matches!(document, Ok(Value::Null)))
        .collect()
}

fn manifest_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// Every object of every manifest, checked, with the file it is in.
fn all_objects() -> Vec<(String, Object)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifest_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", manifest_dir().display());
    let mut objects = Vec::new();
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        let documents = documents(&text).unwrap_or_else(|error| panic!("{name}: {error}"));
        for (index, document) in documents.iter().enumerate() {
            let object = check(document)
                .unwrap_or_else(|error| panic!("{name}, document {}: {error}", index + 1));
            objects.push((name.clone(), object));
        }
    }
    objects
}

#[test]
fn every_manifest_is_read_as_written() {
    let objects = all_objects();
    let kinds: Vec<&str> = objects
        .iter()
        .map(|(_, object)| match object {
            Object::ConfigMap(_) => "ConfigMap",
            Object::Deployment(_) => "Deployment",
            Object::PodDisruptionBudget(_) => "PodDisruptionBudget",
            Object::Secret(_) => "Secret",
            Object::Service(_) => "Service",
            Object::StatefulSet(_) => "StatefulSet",
        })
        .collect();
    for kind in ["ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"] {
        assert!(kinds.contains(&kind), "no {kind} among {kinds:?}");
    }
}

/// Documents the check must refuse, each with what its refusal must say.
#[test]
fn the_check_refuses() {
    let cases = [
        // A misspelt field deep in a pod template.
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers:\n        - name: c\n          image: i\n          readinesProbe: {httpGet: {path: /readyz, port: 80}}\n",
            "`.spec.template.spec.containers[0].readinesProbe`",
        ),
        // A field at the top of a Service.
        ("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspecs: {}\n", "`.specs`"),
        // A field beside known ones.
        (
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec: {minAvailable: 1, selector: {matchLabels: {a: b}}, extra: 1}\n",
            "`.spec.extra`",
        ),
        // A count written as a string.
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: '2', selector: {}, template: {}}\n",
            "invalid type",
        ),
    ];
    for (yaml, said) in cases {
        let document = documents(yaml).unwrap().remove(0);
        let error = check(&document).map(|_| ()).expect_err(yaml);
        assert!(error.contains(said), "{yaml}\nsaid: {error}");
    }
    let unknown = documents("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n").unwrap().remove(0);
    assert!(check(&unknown).is_err(), "a kind the manifests do not use is refused");
}

/// The labels a selector requires are all on the pod template.
fn selects(selector: &std::collections::BTreeMap<String, String>, pod: &PodTemplateSpec) -> bool {
    let labels = pod.metadata.as_ref().and_then(|meta| meta.labels.clone()).unwrap_or_default();
    !selector.is_empty() && selector.iter().all(|(key, value)| labels.get(key) == Some(value))
}

#[test]
fn the_topology_is_the_documented_one() {
    let objects = all_objects();
    let deployments: Vec<&Deployment> = objects
        .iter()
        .filter_map(|(_, object)| match object {
            Object::Deployment(deployment) => Some(deployment.as_ref()),
            _ => None,
        })
        .collect();
    let named = |name: &str| {
        *deployments
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no Deployment {name}"))
    };
    let admin = named("wasmjob-admin");
    let executor = named("wasmjob-executor");
    assert_eq!(admin.spec.as_ref().unwrap().replicas, Some(2), "two admins");

    for deployment in [admin, executor] {
        let name = deployment.metadata.name.clone().unwrap();
        let spec = deployment.spec.as_ref().unwrap();
        let pod = &spec.template;
        let container = &pod.spec.as_ref().unwrap().containers[0];
        let probe_path = |probe: &Option<k8s_openapi::api::core::v1::Probe>| {
            probe.as_ref().and_then(|p| p.http_get.as_ref()).and_then(|get| get.path.clone())
        };
        assert_eq!(probe_path(&container.liveness_probe).as_deref(), Some("/healthz"), "{name}");
        assert_eq!(probe_path(&container.readiness_probe).as_deref(), Some("/readyz"), "{name}");
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(security.allow_privilege_escalation, Some(false), "{name}");
        let pod_security = pod.spec.as_ref().unwrap().security_context.as_ref().unwrap();
        assert_eq!(pod_security.run_as_non_root, Some(true), "{name}");

        let match_labels = spec.selector.match_labels.clone().unwrap_or_default();
        assert!(selects(&match_labels, pod), "{name}: its selector does not select its pods");
        let service = objects.iter().find_map(|(_, object)| match object {
            Object::Service(service) => {
                let selector = service.spec.as_ref()?.selector.clone()?;
                selects(&selector, pod).then_some(service)
            }
            _ => None,
        });
        assert!(service.is_some(), "{name}: no Service selects its pods");
        let budget = objects.iter().find_map(|(_, object)| match object {
            Object::PodDisruptionBudget(budget) => {
                let labels = budget.spec.as_ref()?.selector.as_ref()?.match_labels.clone()?;
                selects(&labels, pod).then_some(budget)
            }
            _ => None,
        });
        assert!(budget.is_some(), "{name}: no PodDisruptionBudget covers its pods");
    }

    // The daemons' files: secrets as `_file` keys, never as values.
    let config = objects
        .iter()
        .find_map(|(_, object)| match object {
            Object::ConfigMap(map) if map.metadata.name.as_deref() == Some("wasmjob-config") => {
                map.data.clone()
            }
            _ => None,
        })
        .expect("the wasmjob-config ConfigMap");
    for (file, key) in [("admin.toml", "admin_token_file"), ("executor.toml", "access_token_file")]
    {
        let text = config.get(file).unwrap_or_else(|| panic!("wasmjob-config has no {file}"));
        assert!(text.contains(key), "{file} takes its token from a file ({key})");
        assert!(!text.contains("access_token =") && !text.contains("admin_token ="), "{file}");
    }

    // Executors pull their runs from every admin pod: their admin URL names a headless Service
    // that selects the admins' pods.
    let executor_toml = config.get("executor.toml").unwrap();
    assert!(executor_toml.contains("pull = true"), "{executor_toml}");
    let admin_pod = &admin.spec.as_ref().unwrap().template;
    let headless = objects.iter().find_map(|(_, object)| match object {
        Object::Service(service) => {
            let spec = service.spec.as_ref()?;
            let selects_admins = selects(spec.selector.as_ref()?, admin_pod);
            (selects_admins && spec.cluster_ip.as_deref() == Some("None"))
                .then(|| service.metadata.name.clone().unwrap())
        }
        _ => None,
    });
    let headless = headless.expect("a headless Service of the admin pods");
    assert!(executor_toml.contains(&format!("http://{headless}:8080")), "{executor_toml}");

    // A StatefulSet's serviceName is a Service of the manifests.
    for (file, object) in &objects {
        if let Object::StatefulSet(set) = object {
            let service_name = &set.spec.as_ref().unwrap().service_name;
            let found = objects.iter().any(|(_, other)| {
                matches!(other, Object::Service(service) if service.metadata.name.as_ref() == service_name.as_ref())
            });
            assert!(found, "{file}: no Service {service_name:?}");
        }
    }

    // The tokens come from the Secret, shipped empty: nothing runs with a token of ours.
    let secret = objects
        .iter()
        .find_map(|(_, object)| match object {
            Object::Secret(secret)
                if secret.metadata.name.as_deref() == Some("wasmjob-secrets") =>
            {
                Some(secret)
            }
            _ => None,
        })
        .expect("the wasmjob-secrets Secret");
    let data = secret.string_data.clone().unwrap_or_default();
    for key in ["admin-token", "access-token", "database-url"] {
        assert_eq!(data.get(key).map(String::as_str), Some(""), "{key} is shipped empty");
    }
}
