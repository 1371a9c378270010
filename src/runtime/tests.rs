//! Trap, limit and stop cases as inline WAT components: each line of a table is a guest body
//! and the outcome it must end with.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use expect_test::{Expect, expect};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::*;

/// A job-world component whose `run` executes `body`, then returns `ok("done")`.
/// `extra` adds core functions; `pages` is the initial memory size.
pub(crate) fn job_wat(pages: u32, body: &str, extra: &str) -> String {
    format!(
        r#"(component
  (type $trigger_def (record
    (field "job-id" s64) (field "log-id" s64) (field "param" string)
    (field "shard-index" u32) (field "shard-total" u32)
    (field "trigger-time-ms" s64) (field "attempt" u32)))
  (import "wasmjob:job/types@0.1.0" (instance $types (export "trigger" (type (eq $trigger_def)))))
  (alias export $types "trigger" (type $trigger))
  (core module $m
    (memory (export "memory") {pages})
    (data (i32.const 64) "done")
    (global $bump (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      ;; Round the bump pointer up to the requested alignment (a power of two).
      (local.set $p (i32.and
        (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get 2))))
      (global.set $bump (i32.add (local.get $p) (local.get 3)))
      (local.get $p))
    {extra}
    (func (export "run") (param i64 i64 i32 i32 i32 i32 i64 i32) (result i32)
      {body}
      (i32.store8 (i32.const 16) (i32.const 0))
      (i32.store (i32.const 20) (i32.const 64))
      (i32.store (i32.const 24) (i32.const 4))
      (i32.const 16)))
  (core instance $i (instantiate $m))
  (func $run (param "t" $trigger) (result (result string (error string)))
    (canon lift (core func $i "run") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (export "run" (func $run)))"#
    )
}

#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl LogSink for Lines {
    fn line(&mut self, _level: Level, message: &str) {
        self.0.lock().unwrap().push(message.to_owned());
    }
}

fn trigger() -> Trigger {
    Trigger {
        job_id: 1,
        log_id: 1,
        param: "p".to_owned(),
        shard_index: 0,
        shard_total: 1,
        trigger_time_ms: 0,
        attempt: 0,
    }
}

struct Case {
    wat: String,
    limits: RunLimits,
    kill_after: Option<Duration>,
}

fn case(body: &str) -> Case {
    Case { wat: job_wat(1, body, ""), limits: RunLimits::default(), kill_after: None }
}

const LOOP: &str = "(loop $l (br $l))";

async fn run_case(runtime: &Runtime, case: Case) -> RunOutcome {
    let sha256 = hex::encode(Sha256::digest(case.wat.as_bytes()));
    let job = runtime.load(&sha256, || Ok(case.wat.into_bytes())).unwrap();
    let cancel = CancellationToken::new();
    if let Some(after) = case.kill_after {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            cancel.cancel();
        });
    }
    runtime
        .run(&job, trigger(), Imports::default(), &case.limits, Box::new(Lines::default()), &cancel)
        .await
}

async fn check(runtime: &Runtime, case: Case, expect: Expect) {
    let outcome = run_case(runtime, case).await;
    expect.assert_eq(&format!("{} {outcome}", outcome.handle_code()));
}

fn pooled() -> Runtime {
    let pool = PoolConfig { max_concurrent_runs: 4, max_memory_bytes: 64 * 1024 * 1024 };
    Runtime::new(RuntimeConfig { pool: Some(pool), ..RuntimeConfig::default() }).unwrap()
}

#[tokio::test]
async fn outcomes() {
    let rt = pooled();
    let small = |mut case: Case| {
        case.limits.memory_bytes = 1024 * 1024;
        case
    };
    let timeout = |mut case: Case| {
        case.limits.timeout = Some(Duration::from_millis(100));
        case
    };
    check(&rt, case(""), expect![["200 done"]]).await;
    check(&rt, case("unreachable"), expect!["500 trap (unreachable (guest panic or abort)): wasm trap: wasm `unreachable` instruction executed"]).await;
    check(
        &rt,
        case("(drop (i32.div_s (i32.const 1) (i32.const 0)))"),
        expect![["500 trap (integer division by zero): wasm trap: integer divide by zero"]],
    )
    .await;
    check(
        &rt,
        case("(drop (i32.load (i32.const 70000)))"),
        expect![["500 trap (memory out of bounds): wasm trap: out of bounds memory access"]],
    )
    .await;
    check(
        &rt,
        timeout(case(LOOP)),
        expect![["502 timeout: the run passed its deadline and was stopped"]],
    )
    .await;
    let mut starved = case(LOOP);
    starved.limits.fuel = 100_000;
    check(&rt, starved, expect![["500 out of fuel: the run spent its fuel budget"]]).await;
    let mut killed = case(LOOP);
    killed.kill_after = Some(Duration::from_millis(50));
    check(&rt, killed, expect![["500 killed: the run was stopped on request"]]).await;
    let grow = "(if (i32.eq (memory.grow (i32.const 100)) (i32.const -1)) (then unreachable))";
    check(&rt, small(case(grow)), expect![["500 resource limit: memory limit of 1 MiB reached"]])
        .await;
    let big_start = Case { wat: job_wat(100, "", ""), ..small(case("")) };
    check(&rt, big_start, expect![["500 resource limit: memory limit of 1 MiB reached"]]).await;
    let deep = Case { wat: job_wat(1, "(call $deep)", "(func $deep (call $deep))"), ..case("") };
    check(&rt, deep, expect![["500 trap (stack overflow): wasm trap: call stack exhausted"]]).await;
}

#[tokio::test]
async fn no_deadline_is_no_trap_and_fuel_is_counted() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let mut open = case("");
    open.limits.timeout = None;
    let RunOutcome::Success { message, fuel_used } = run_case(&rt, open).await else {
        panic!("not a success")
    };
    assert_eq!(message, "done");
    assert!(fuel_used.is_some_and(|fuel| fuel > 0), "{fuel_used:?}");
    // The same module again comes from memory, not from the compiler.
    let stats = rt.cache_stats();
    run_case(&rt, case("")).await;
    assert_eq!(rt.cache_stats().compiled, stats.compiled);
    assert_eq!(rt.cache_stats().memory_hits, stats.memory_hits + 1);
}

/// A run beyond the pool waits for a slot instead of failing; while it waits, its deadline and
/// a kill apply as they do to a running guest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_beyond_the_pool_wait_for_a_slot() {
    let pool = PoolConfig { max_concurrent_runs: 1, max_memory_bytes: 64 * 1024 * 1024 };
    let rt = Arc::new(
        Runtime::new(RuntimeConfig { pool: Some(pool), ..RuntimeConfig::default() }).unwrap(),
    );
    // The only slot goes to a guest that spins until it is killed.
    let spin_kill = CancellationToken::new();
    let spinning = {
        let (rt, cancel) = (rt.clone(), spin_kill.clone());
        tokio::spawn(async move {
            let wat = job_wat(1, LOOP, "");
            let job = rt.load(&hex::encode(Sha256::digest(wat.as_bytes())), || Ok(wat.into()));
            let limits = RunLimits::default();
            let log = Box::new(Lines::default());
            rt.run(&job.unwrap(), trigger(), Imports::default(), &limits, log, &cancel).await
        })
    };
    while rt.free_slots() != Some(0) {
        tokio::task::yield_now().await;
    }
    let waiting = {
        let rt = rt.clone();
        tokio::spawn(async move { run_case(&rt, case("")).await })
    };
    let mut killed = case("");
    killed.kill_after = Some(Duration::from_millis(20));
    check(&rt, killed, expect![["500 killed: the run was stopped on request"]]).await;
    let mut late = case("");
    late.limits.timeout = Some(Duration::from_millis(20));
    check(&rt, late, expect![["502 timeout: the run passed its deadline and was stopped"]]).await;
    assert!(!waiting.is_finished(), "a run took a slot that was not free");

    spin_kill.cancel();
    assert_eq!(spinning.await.unwrap(), RunOutcome::Killed);
    let outcome = waiting.await.unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Success { message, .. } if message == "done"),
        "{outcome}"
    );
    assert_eq!(rt.free_slots(), Some(1));
}

#[test]
fn artifacts_survive_a_restart_and_are_not_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        RuntimeConfig { cache_dir: Some(dir.path().to_owned()), ..RuntimeConfig::default() };
    let wat = job_wat(1, "", "");
    let sha256 = hex::encode(Sha256::digest(wat.as_bytes()));
    let first = Runtime::new(config.clone()).unwrap();
    first.load(&sha256, || Ok(wat.clone().into_bytes())).unwrap();
    assert_eq!(first.cache_stats().compiled, 1);
    drop(first);
    let second = Runtime::new(config).unwrap();
    second.load(&sha256, || panic!("the cached artifact should be used")).unwrap();
    assert_eq!((second.cache_stats().compiled, second.cache_stats().loaded_from_disk), (0, 1));
    // Bytes that do not match their digest are never compiled.
    let error = second.load(&"0".repeat(64), || Ok(wat.into_bytes())).err().unwrap();
    assert!(error.to_string().contains("digest mismatch"), "{error}");
}

#[test]
fn concurrent_loads_of_one_module_compile_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        RuntimeConfig { cache_dir: Some(dir.path().to_owned()), ..RuntimeConfig::default() };
    let runtime = Arc::new(Runtime::new(config).unwrap());
    let wat = job_wat(1, "", "");
    let sha256 = hex::encode(Sha256::digest(wat.as_bytes()));
    // Every thread waits at the barrier, then all ask for the same new module at once.
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let loaders: Vec<_> = (0..8)
        .map(|_| {
            let (runtime, barrier, wat, sha256) =
                (runtime.clone(), barrier.clone(), wat.clone(), sha256.clone());
            std::thread::spawn(move || {
                barrier.wait();
                runtime.load(&sha256, || Ok(wat.into_bytes())).map(|job| job.sha256.clone())
            })
        })
        .collect();
    for loader in loaders {
        assert_eq!(loader.join().unwrap().unwrap().as_ref(), sha256);
    }
    let stats = runtime.cache_stats();
    assert_eq!(stats.compiled, 1, "{stats:?}");
    assert_eq!(stats.memory_hits + stats.loaded_from_disk, 7, "{stats:?}");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flat_map(|sub| std::fs::read_dir(sub.unwrap().path()).unwrap())
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".cwasm"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left behind: {leftovers:?}");
}

/// A component that imports `sharding` and returns the parameter of the last item it is given,
/// or `none` when it gets no items.
const SHARDING_WAT: &str = r#"(component
  (type $trigger_def (record
    (field "job-id" s64) (field "log-id" s64) (field "param" string)
    (field "shard-index" u32) (field "shard-total" u32)
    (field "trigger-time-ms" s64) (field "attempt" u32)))
  (import "wasmjob:job/types@0.1.0" (instance $types (export "trigger" (type (eq $trigger_def)))))
  (alias export $types "trigger" (type $trigger))
  (import "wasmjob:job/sharding@0.1.0" (instance $sharding
    (type $item_def (record (field "item" u32) (field "parameter" string)))
    (export "sharding-item" (type $item (eq $item_def)))
    (export "items" (func (result (list $item))))))
  (alias export $sharding "items" (func $items))
  (core module $libc
    (memory (export "memory") 1)
    (global $bump (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and
        (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get 2))))
      (global.set $bump (i32.add (local.get $p) (local.get 3)))
      (local.get $p)))
  (core instance $libc (instantiate $libc))
  (core func $items_lowered (canon lower (func $items)
    (memory (core memory $libc "memory")) (realloc (core func $libc "realloc"))))
  (core module $m
    (import "libc" "memory" (memory 1))
    (import "sharding" "items" (func $items (param i32)))
    (data (i32.const 64) "none")
    (func (export "run") (param i64 i64 i32 i32 i32 i32 i64 i32) (result i32)
      (local $last i32)
      ;; items() writes the list's pointer at 32 and its length at 36; an item is 12 bytes:
      ;; the number, then the parameter's pointer and length.
      (call $items (i32.const 32))
      (i32.store8 (i32.const 16) (i32.const 0))
      (i32.store (i32.const 20) (i32.const 64))
      (i32.store (i32.const 24) (i32.const 4))
      (if (i32.load (i32.const 36))
        (then
          (local.set $last (i32.add (i32.load (i32.const 32))
            (i32.mul (i32.sub (i32.load (i32.const 36)) (i32.const 1)) (i32.const 12))))
          (i32.store (i32.const 20) (i32.load offset=4 (local.get $last)))
          (i32.store (i32.const 24) (i32.load offset=8 (local.get $last)))))
      (i32.const 16)))
  (core instance $i (instantiate $m
    (with "libc" (instance $libc))
    (with "sharding" (instance (export "items" (func $items_lowered))))))
  (func $run (param "t" $trigger) (result (result string (error string)))
    (canon lift (core func $i "run") (memory (core memory $libc "memory"))
      (realloc (core func $libc "realloc"))))
  (export "run" (func $run)))"#;

#[tokio::test]
async fn the_sharding_import_gives_the_runs_items() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let info = rt.validate(&wat::parse_str(SHARDING_WAT).unwrap()).unwrap();
    assert!(info.imports.contains(&"wasmjob:job/sharding@0.1.0".to_owned()), "{:?}", info.imports);
    let sha256 = hex::encode(Sha256::digest(SHARDING_WAT.as_bytes()));
    let job = rt.load(&sha256, || Ok(SHARDING_WAT.as_bytes().to_vec())).unwrap();
    let run = |items: Vec<ShardingItem>| {
        let (job, cancel) = (job.clone(), CancellationToken::new());
        let log = Box::new(Lines::default());
        let rt = &rt;
        let imports = Imports { sharding_items: items, ..Imports::default() };
        async move { rt.run(&job, trigger(), imports, &RunLimits::default(), log, &cancel).await }
    };
    let item = |item, parameter: &str| ShardingItem { item, parameter: parameter.to_owned() };
    let outcome = run(vec![item(0, "Beijing"), item(3, "Shenzhen")]).await;
    assert!(
        matches!(&outcome, RunOutcome::Success { message, .. } if message == "Shenzhen"),
        "{outcome}"
    );
    let outcome = run(Vec::new()).await;
    assert!(
        matches!(&outcome, RunOutcome::Success { message, .. } if message == "none"),
        "{outcome}"
    );
}
