//! A `FIX_DELAY` job's next fire, as a consequence of the transitions that end its runs.

use expect_test::{Expect, expect};

use super::*;

/// Only the legal moves, for tables about one consequence.
fn check_legal(run: RunFacts, job: Option<&JobFacts>, expect: Expect) {
    let legal: String = render(run, job)
        .lines()
        .filter(|line| !line.ends_with("illegal"))
        .map(|line| format!("{line}\n"))
        .collect();
    expect.assert_eq(&legal);
}

const FIX_DELAY_JOB: JobFacts =
    JobFacts { retry_count: 1, has_children: false, fix_delay_ms: Some(30_000) };

#[test]
fn a_fix_delay_fire_schedules_the_next_once_no_retry_follows() {
    // The first try: a failure is retried, so only the ends without a retry set the next fire.
    check_legal(
        FIRST_TRY,
        Some(&FIX_DELAY_JOB),
        expect![[r#"
            pending + claim -> dispatching
            pending + discard -> skipped handle 200 `at its cap`, +next fire in 30000 ms
            pending + kill -> killed handle 500 `killed before it was sent`, +next fire in 30000 ms
            pending + skip -> skipped handle 200 `stopped`, +next fire in 30000 ms
            dispatching + claim -> dispatching
            dispatching + sent -> running trigger 200, `sent to http://e1`, dispatched 1000 deadline 6100
            dispatching + not sent -> failed trigger 500, `refused`, handle 500 `trigger failed: refused`, +retry
            dispatching + result 200 -> success trigger 200, dispatched 900 deadline 0, handle 200 `ok`, +next fire in 30000 ms
            dispatching + result 200 (accepted unrecorded) -> success trigger 200, `sent to http://e1`, dispatched 850 deadline 0, handle 200 `ok`, +next fire in 30000 ms
            dispatching + result 500 -> failed trigger 200, handle 500 `boom`, +retry
            dispatching + result 502 -> timed_out trigger 200, handle 502 `slow`, +retry
            dispatching + kill -> dispatching +kill requested
            dispatching + skip -> skipped handle 200 `stopped`, +next fire in 30000 ms
            dispatching + lost -> lost handle 500 `gone`, +retry, +send kill
            running + result 200 -> success handle 200 `ok`, +next fire in 30000 ms
            running + result 200 (accepted unrecorded) -> success handle 200 `ok`, +next fire in 30000 ms
            running + result 500 -> failed handle 500 `boom`, +retry
            running + result 502 -> timed_out handle 502 `slow`, +retry
            running + kill -> running +kill requested, +send kill
            running + lost -> lost handle 500 `gone`, +retry, +send kill
            running + deadline passed -> timed_out handle 502 `timed out: no result within the job's timeout and the grace period`, +retry, +send kill
        "#]],
    );
}

#[test]
fn the_last_try_of_a_fix_delay_fire_schedules_the_next_whatever_its_end() {
    let retry = RunFacts { attempt: 1, trigger_type: TriggerType::Retry, ..FIRST_TRY };
    check_legal(
        retry,
        Some(&FIX_DELAY_JOB),
        expect![[r#"
            pending + claim -> dispatching
            pending + discard -> skipped handle 200 `at its cap`, +next fire in 30000 ms
            pending + kill -> killed handle 500 `killed before it was sent`, +next fire in 30000 ms
            dispatching + claim -> dispatching
            dispatching + sent -> running trigger 200, `sent to http://e1`, dispatched 1000 deadline 6100
            dispatching + not sent -> failed trigger 500, `refused`, handle 500 `trigger failed: refused`, +alarm, +next fire in 30000 ms
            dispatching + result 200 -> success trigger 200, dispatched 900 deadline 0, handle 200 `ok`, +next fire in 30000 ms
            dispatching + result 200 (accepted unrecorded) -> success trigger 200, `sent to http://e1`, dispatched 850 deadline 0, handle 200 `ok`, +next fire in 30000 ms
            dispatching + result 500 -> failed trigger 200, handle 500 `boom`, +alarm, +next fire in 30000 ms
            dispatching + result 502 -> timed_out trigger 200, handle 502 `slow`, +alarm, +next fire in 30000 ms
            dispatching + kill -> dispatching +kill requested
            dispatching + lost -> lost handle 500 `gone`, +send kill, +alarm, +next fire in 30000 ms
            running + result 200 -> success handle 200 `ok`, +next fire in 30000 ms
            running + result 200 (accepted unrecorded) -> success handle 200 `ok`, +next fire in 30000 ms
            running + result 500 -> failed handle 500 `boom`, +alarm, +next fire in 30000 ms
            running + result 502 -> timed_out handle 502 `slow`, +alarm, +next fire in 30000 ms
            running + kill -> running +kill requested, +send kill
            running + lost -> lost handle 500 `gone`, +send kill, +alarm, +next fire in 30000 ms
            running + deadline passed -> timed_out handle 502 `timed out: no result within the job's timeout and the grace period`, +send kill, +alarm, +next fire in 30000 ms
        "#]],
    );
}

#[test]
fn a_manual_run_of_a_fix_delay_job_schedules_nothing() {
    let manual = RunFacts { trigger_type: TriggerType::Manual, from_fire: false, ..FIRST_TRY };
    check_legal(
        manual,
        Some(&FIX_DELAY_JOB),
        expect![[r#"
            pending + claim -> dispatching
            pending + discard -> skipped handle 200 `at its cap`
            pending + kill -> killed handle 500 `killed before it was sent`
            dispatching + claim -> dispatching
            dispatching + sent -> running trigger 200, `sent to http://e1`, dispatched 1000 deadline 6100
            dispatching + not sent -> failed trigger 500, `refused`, handle 500 `trigger failed: refused`, +retry
            dispatching + result 200 -> success trigger 200, dispatched 900 deadline 0, handle 200 `ok`
            dispatching + result 200 (accepted unrecorded) -> success trigger 200, `sent to http://e1`, dispatched 850 deadline 0, handle 200 `ok`
            dispatching + result 500 -> failed trigger 200, handle 500 `boom`, +retry
            dispatching + result 502 -> timed_out trigger 200, handle 502 `slow`, +retry
            dispatching + kill -> dispatching +kill requested
            dispatching + lost -> lost handle 500 `gone`, +retry, +send kill
            running + result 200 -> success handle 200 `ok`
            running + result 200 (accepted unrecorded) -> success handle 200 `ok`
            running + result 500 -> failed handle 500 `boom`, +retry
            running + result 502 -> timed_out handle 502 `slow`, +retry
            running + kill -> running +kill requested, +send kill
            running + lost -> lost handle 500 `gone`, +retry, +send kill
            running + deadline passed -> timed_out handle 502 `timed out: no result within the job's timeout and the grace period`, +retry, +send kill
        "#]],
    );
}
