//! Workload (x): jobs every second fired to an XXL-JOB executor, as a team that moves its
//! scheduler to wasmjob and keeps its Java executors runs it.
//!
//! The executor is written here, small and fast, so that what is measured is the admin: it
//! speaks XXL-JOB 2.4 (`/run`, `/beat`, `/idleBeat`, `/kill`, `/log`), registers every 30 s as
//! the Java executor does, answers each `/run` at once and records its arrival, and sends results
//! as XXL-JOB 2.4's callback thread does: it takes what has queued since its last callback and
//! posts it in one `/api/callback`, waiting for the answer (3 s at most, the Java client's
//! timeout) before the next. A callback not acknowledged is sent again 30 s later, as the Java
//! executor retries its failed-callback file.
//!
//! With `--xxl-admin URL --xxl-admin-pid PID`, the same executor measures an XXL-JOB admin the
//! bench did not start (another build, or another scheduler that speaks the protocol), so that
//! two admins can be measured side by side on one machine (`against_other_admin`).
//! `--instant-from-receipt` takes the scheduled second from the receipt of `/run`, not from
//! `logDateTime`, for an admin that sends something else there: lateness is then the part of
//! the second of receipt past it, and a fire more than 1 s late counts for the next second (a
//! duplicate there and a miss in its own).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// A fire as the executor received it.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    job_id: i64,
    /// The scheduled instant (`logDateTime`).
    scheduled_ms: i64,
    received_ms: i64,
}

/// One result waiting for its callback.
#[derive(Debug, Clone, Copy)]
struct Done {
    log_id: i64,
    log_date_tim: i64,
}

#[derive(Default)]
struct Recorded {
    arrivals: Vec<Arrival>,
    /// How long each `/api/callback` took to answer, in ms, and how many results it carried.
    callbacks: Vec<(u64, usize)>,
    /// Callbacks that were not acknowledged (a failure answer, an error or no answer in 3 s).
    callbacks_failed: usize,
    results_acknowledged: usize,
}

/// The bench's XXL-JOB executor, serving on 127.0.0.1.
pub struct XxlExecutor {
    recorded: Arc<Mutex<Recorded>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Clone)]
struct Shared {
    recorded: Arc<Mutex<Recorded>>,
    done: mpsc::UnboundedSender<Done>,
    /// `--instant-from-receipt`.
    instant_from_receipt: bool,
}

impl XxlExecutor {
    /// Serves on a free port and registers as `app_name` with the admin at `admin_url`.
    pub async fn start(
        admin_url: &str,
        app_name: &str,
        access_token: &str,
        instant_from_receipt: bool,
    ) -> XxlExecutor {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let recorded = Arc::new(Mutex::new(Recorded::default()));
        let (done, queue) = mpsc::unbounded_channel();
        let shared = Shared { recorded: recorded.clone(), done, instant_from_receipt };
        let app = Router::new().fallback(answer).with_state(shared);
        let serve = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        // The Java client's timeouts: 3 s for a callback.
        let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().unwrap();
        let registry = json!({"registryGroup": "EXECUTOR", "registryKey": app_name,
            "registryValue": format!("{url}/")});
        let (beat_http, beat_admin, beat_token) =
            (http.clone(), admin_url.to_owned(), access_token.to_owned());
        let beat = tokio::spawn(async move {
            loop {
                let _ = beat_http
                    .post(format!("{beat_admin}/api/registry"))
                    .header("XXL-JOB-ACCESS-TOKEN", &beat_token)
                    .json(&registry)
                    .send()
                    .await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
        });
        let callbacks = tokio::spawn(callback_thread(
            http,
            format!("{admin_url}/api/callback"),
            access_token.to_owned(),
            queue,
            recorded.clone(),
        ));
        XxlExecutor { recorded, tasks: vec![serve, beat, callbacks] }
    }

    /// Prints workload (x)'s figures for the scheduled seconds `from..=until` (ms): `jobs`
    /// jobs were due each second; `cpu_secs` is the admin's CPU time over the window.
    pub fn report(
        &self,
        jobs: usize,
        from: i64,
        until: i64,
        cpu_secs: f64,
        instructions: Option<u64>,
    ) {
        let recorded = self.recorded.lock().unwrap();
        let in_window: Vec<&Arrival> = recorded
            .arrivals
            .iter()
            .filter(|arrival| arrival.scheduled_ms >= from && arrival.scheduled_ms <= until)
            .collect();
        let distinct: HashSet<(i64, i64)> =
            in_window.iter().map(|arrival| (arrival.job_id, arrival.scheduled_ms)).collect();
        let seconds = (until - from) / 1000 + 1;
        let expected = seconds * jobs as i64;
        let lateness: Vec<i64> =
            in_window.iter().map(|arrival| arrival.received_ms - arrival.scheduled_ms).collect();
        println!("x.jobs_due_per_sec: {jobs}");
        println!("x.fires_per_sec: {:.0}", distinct.len() as f64 / seconds as f64);
        println!("x.missed_fires: {}", expected - distinct.len() as i64);
        println!("x.duplicate_fires: {}", in_window.len() - distinct.len());
        super::print_percentiles("x.fire_lateness", Some(lateness));
        let fires = in_window.len().max(1) as f64;
        println!("x.admin_cpu_secs_per_1000_fires: {:.3}", cpu_secs * 1000.0 / fires);
        if let Some(instructions) = instructions {
            println!("x.admin_instructions_per_fire: {:.0}", instructions as f64 / fires);
        }
        let answers: Vec<i64> = recorded.callbacks.iter().map(|(ms, _)| *ms as i64).collect();
        let max = answers.iter().copied().max().unwrap_or(0);
        let results: usize = recorded.callbacks.iter().map(|(_, n)| n).sum();
        println!("x.callbacks: {}", recorded.callbacks.len());
        println!(
            "x.results_per_callback: {:.1}",
            results as f64 / recorded.callbacks.len().max(1) as f64
        );
        super::print_percentiles("x.callback_answer", Some(answers));
        println!("x.callback_answer_max_ms: {max}");
        // An answer waits for its results' writes: how long it takes grows with their number.
        let by_size: Vec<String> = [(0, 500), (500, 2_000), (2_000, usize::MAX)]
            .iter()
            .map(|&(from, to)| {
                let took: Vec<u64> = recorded
                    .callbacks
                    .iter()
                    .filter(|(_, n)| (from..to).contains(n))
                    .map(|(ms, _)| *ms)
                    .collect();
                let mean = took.iter().sum::<u64>() / (took.len().max(1) as u64);
                let bound =
                    if to == usize::MAX { format!("{from}+") } else { format!("{from}-{to}") };
                format!("{bound} results: {} callbacks, {mean} ms", took.len())
            })
            .collect();
        println!("x.callback_answer_mean_by_results: {}", by_size.join("; "));
        println!("x.callbacks_failed: {}", recorded.callbacks_failed);
        println!("x.results_acknowledged: {}", recorded.results_acknowledged);
    }

    /// How many distinct jobs have reached the executor so far.
    fn jobs_seen(&self) -> usize {
        let recorded = self.recorded.lock().unwrap();
        recorded.arrivals.iter().map(|arrival| arrival.job_id).collect::<HashSet<_>>().len()
    }

    pub fn stop(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

/// Every route of an XXL-JOB 2.4 executor; `/run` is recorded and its result queued.
async fn answer(State(shared): State<Shared>, request: Request) -> axum::Json<Value> {
    let received_ms = super::now_ms();
    let path = request.uri().path().to_owned();
    let body: Bytes =
        axum::body::to_bytes(request.into_body(), 16 * 1024 * 1024).await.unwrap_or_default();
    match path.as_str() {
        "/run" => {
            let param: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let field = |name: &str| param[name].as_i64().unwrap_or(0);
            let scheduled_ms = match shared.instant_from_receipt {
                true => received_ms / 1000 * 1000,
                false => field("logDateTime"),
            };
            let arrival = Arrival { job_id: field("jobId"), scheduled_ms, received_ms };
            shared.recorded.lock().unwrap().arrivals.push(arrival);
            let done = Done { log_id: field("logId"), log_date_tim: field("logDateTime") };
            let _ = shared.done.send(done);
            axum::Json(json!({"code": 200}))
        }
        "/beat" | "/idleBeat" | "/kill" => axum::Json(json!({"code": 200})),
        "/log" => axum::Json(json!({"code": 200, "content": {"fromLineNum": 1, "toLineNum": 0,
            "logContent": "", "isEnd": true}})),
        other => axum::Json(
            json!({"code": 500, "msg": format!("invalid request, uri-mapping({other}) not found.")}),
        ),
    }
}

/// XXL-JOB 2.4's `TriggerCallbackThread`: take one result, drain the rest, post them together.
async fn callback_thread(
    http: reqwest::Client,
    url: String,
    token: String,
    mut queue: mpsc::UnboundedReceiver<Done>,
    recorded: Arc<Mutex<Recorded>>,
) {
    let mut failed: Vec<(Instant, Vec<Done>)> = Vec::new();
    let mut batch = Vec::new();
    loop {
        // Failed callbacks go again after 30 s, as the Java executor's retry thread sends them.
        let now = Instant::now();
        if let Some(index) = failed.iter().position(|(at, _)| *at <= now) {
            batch = failed.swap_remove(index).1;
        } else {
            let wait = tokio::time::timeout(Duration::from_millis(500), queue.recv()).await;
            match wait {
                Ok(Some(done)) => batch.push(done),
                Ok(None) => return,
                Err(_) => continue,
            }
            while let Ok(done) = queue.try_recv() {
                batch.push(done);
            }
        }
        let body: Vec<Value> = batch
            .iter()
            .map(|done| {
                json!({"logId": done.log_id, "logDateTim": done.log_date_tim, "handleCode": 200,
                    "handleMsg": null})
            })
            .collect();
        let sent = Instant::now();
        let reply = http.post(&url).header("XXL-JOB-ACCESS-TOKEN", &token).json(&body).send();
        let acknowledged = match reply.await {
            Ok(reply) => reply.json::<Value>().await.is_ok_and(|answer| answer["code"] == 200),
            Err(_) => false,
        };
        let took = sent.elapsed().as_millis() as u64;
        let mut recorded = recorded.lock().unwrap();
        recorded.callbacks.push((took, batch.len()));
        if acknowledged {
            recorded.results_acknowledged += batch.len();
            batch.clear();
        } else {
            recorded.callbacks_failed += 1;
            failed.push((Instant::now() + Duration::from_secs(30), std::mem::take(&mut batch)));
        }
    }
}

/// Workload (x) against the XXL-JOB admin at `--xxl-admin`, process `--xxl-admin-pid`, which the
/// bench did not start. The bench serves its executor and registers it as the application
/// `default`; creating the `--jobs` jobs (every second, handler `demoJobHandler`, routed to that
/// application) is the operator's, once `x.executor_registered` is printed. The judged window
/// starts 3 s after every job has reached the executor once (10 min at most) and lasts
/// `--secs` - 6 s; the admin's CPU time and peak memory come from `/proc`.
pub async fn against_other_admin(args: &super::Args) {
    let admin = args.xxl_admin.as_deref().unwrap();
    let pid = args
        .xxl_admin_pid
        .expect("--xxl-admin needs --xxl-admin-pid, the admin's process id, to read its CPU time");
    assert!(args.secs > 7, "--secs must leave a judged window: 8 or more");
    let token = &args.xxl_access_token;
    let executor = XxlExecutor::start(admin, "default", token, args.instant_from_receipt).await;
    println!(
        "x.executor_registered: application `default` at {admin}; waiting for {} jobs",
        args.jobs
    );
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while executor.jobs_seen() < args.jobs {
        assert!(
            Instant::now() < deadline,
            "only {} of {} jobs reached the executor in 10 minutes",
            executor.jobs_seen(),
            args.jobs
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let from = (super::now_ms() / 1000 + 3) * 1000;
    let until = from + (args.secs as i64 - 7) * 1000;
    let sleep_until =
        |ms: i64| tokio::time::sleep(Duration::from_millis((ms - super::now_ms()).max(0) as u64));
    sleep_until(from).await;
    let cpu_before = super::cpu_secs(pid);
    println!("x.window_secs: {} (admin pid {pid})", (until + 1000 - from) / 1000);
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    sleep_until(until + 1000).await;
    let cpu = super::cpu_secs(pid) - cpu_before;
    // Late fires and their callbacks land.
    tokio::time::sleep(Duration::from_secs(5)).await;
    executor.report(args.jobs, from, until, cpu, None);
    println!("x.admin_rss_mb: {:.1}", super::peak_rss_mb(pid));
    executor.stop();
}
