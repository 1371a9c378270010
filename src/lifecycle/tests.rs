//! Every (state, event) pair through [`transition`], as one table: legal moves with their
//! recorded fields and consequences, and the illegal ones.

use expect_test::{Expect, expect};

use super::*;

mod fix_delay;

fn events() -> Vec<Event> {
    vec![
        Event::Claim,
        Event::Sent {
            address: "http://e1".to_owned(),
            at_ms: 1_000,
            timeout_secs: 5,
            grace_ms: 100,
        },
        Event::NotSent { reason: "refused".to_owned() },
        Event::Discard { reason: "at its cap".to_owned() },
        Event::Result {
            handle_code: 200,
            message: "ok".to_owned(),
            started_at_ms: Some(900),
            accepted: None,
        },
        // The dispatcher saw the executor take the run and had not recorded it yet.
        Event::Result {
            handle_code: 200,
            message: "ok".to_owned(),
            started_at_ms: Some(900),
            accepted: Some(("http://e1".to_owned(), 850)),
        },
        Event::Result {
            handle_code: 500,
            message: "boom".to_owned(),
            started_at_ms: None,
            accepted: None,
        },
        Event::Result {
            handle_code: 502,
            message: "slow".to_owned(),
            started_at_ms: None,
            accepted: None,
        },
        Event::Kill,
        Event::Skip { reason: "stopped".to_owned() },
        Event::Lost { reason: "gone".to_owned() },
        Event::DeadlinePassed,
    ]
}

fn render(run: RunFacts, job: Option<&JobFacts>) -> String {
    let mut out = String::new();
    for state in RunState::ALL {
        for event in events() {
            let facts = RunFacts { state: *state, ..run };
            let label = match &event {
                Event::Result { handle_code, accepted: Some(_), .. } => {
                    format!("result {handle_code} (accepted unrecorded)")
                }
                Event::Result { handle_code, .. } => format!("result {handle_code}"),
                other => other.name().to_owned(),
            };
            let line = match transition(&facts, job, &event) {
                Err(_) => format!("{state} + {label} -> illegal"),
                Ok(t) => {
                    let mut fields = Vec::new();
                    if let Some(code) = t.trigger_code {
                        fields.push(format!("trigger {code}"));
                    }
                    if let Some(msg) = &t.trigger_msg {
                        fields.push(format!("`{msg}`"));
                    }
                    if let Some((at, deadline)) = t.dispatched {
                        fields.push(format!("dispatched {at} deadline {deadline}"));
                    }
                    if let Some((code, msg)) = &t.handle {
                        fields.push(format!("handle {code} `{msg}`"));
                    }
                    for (flag, name) in [
                        (t.request_kill, "+kill requested"),
                        (t.retry, "+retry"),
                        (t.children, "+children"),
                        (t.send_kill, "+send kill"),
                        (t.alarm, "+alarm"),
                    ] {
                        if flag {
                            fields.push(name.to_owned());
                        }
                    }
                    if let Some(delay) = t.next_fire_delay_ms {
                        fields.push(format!("+next fire in {delay} ms"));
                    }
                    format!("{} + {label} -> {} {}", t.from, t.to, fields.join(", "))
                }
            };
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

fn check(run: RunFacts, job: Option<&JobFacts>, expect: Expect) {
    expect.assert_eq(&render(run, job));
}

const FIRST_TRY: RunFacts = RunFacts {
    state: RunState::Pending,
    attempt: 0,
    kill_requested: false,
    trigger_type: TriggerType::Cron,
    from_fire: true,
};
const JOB: JobFacts = JobFacts { retry_count: 1, has_children: true, fix_delay_ms: None };

#[test]
fn first_try_of_a_job_with_a_retry_and_children() {
    check(
        FIRST_TRY,
        Some(&JOB),
        expect![[r#"
            pending + claim -> dispatching
            pending + sent -> illegal
            pending + not sent -> illegal
            pending + discard -> skipped handle 200 `at its cap`
            pending + result 200 -> illegal
            pending + result 200 (accepted unrecorded) -> illegal
            pending + result 500 -> illegal
            pending + result 502 -> illegal
            pending + kill -> killed handle 500 `killed before it was sent`
            pending + skip -> skipped handle 200 `stopped`
            pending + lost -> illegal
            pending + deadline passed -> illegal
            dispatching + claim -> dispatching
            dispatching + sent -> running trigger 200, `sent to http://e1`, dispatched 1000 deadline 6100
            dispatching + not sent -> failed trigger 500, `refused`, handle 500 `trigger failed: refused`, +retry
            dispatching + discard -> illegal
            dispatching + result 200 -> success trigger 200, dispatched 900 deadline 0, handle 200 `ok`, +children
            dispatching + result 200 (accepted unrecorded) -> success trigger 200, `sent to http://e1`, dispatched 850 deadline 0, handle 200 `ok`, +children
            dispatching + result 500 -> failed trigger 200, handle 500 `boom`, +retry
            dispatching + result 502 -> timed_out trigger 200, handle 502 `slow`, +retry
            dispatching + kill -> dispatching +kill requested
            dispatching + skip -> skipped handle 200 `stopped`
            dispatching + lost -> lost handle 500 `gone`, +retry, +send kill
            dispatching + deadline passed -> illegal
            running + claim -> illegal
            running + sent -> illegal
            running + not sent -> illegal
            running + discard -> illegal
            running + result 200 -> success handle 200 `ok`, +children
            running + result 200 (accepted unrecorded) -> success handle 200 `ok`, +children
            running + result 500 -> failed handle 500 `boom`, +retry
            running + result 502 -> timed_out handle 502 `slow`, +retry
            running + kill -> running +kill requested, +send kill
            running + skip -> illegal
            running + lost -> lost handle 500 `gone`, +retry, +send kill
            running + deadline passed -> timed_out handle 502 `timed out: no result within the job's timeout and the grace period`, +retry, +send kill
            success + claim -> illegal
            success + sent -> illegal
            success + not sent -> illegal
            success + discard -> illegal
            success + result 200 -> illegal
            success + result 200 (accepted unrecorded) -> illegal
            success + result 500 -> illegal
            success + result 502 -> illegal
            success + kill -> illegal
            success + skip -> illegal
            success + lost -> illegal
            success + deadline passed -> illegal
            failed + claim -> illegal
            failed + sent -> illegal
            failed + not sent -> illegal
            failed + discard -> illegal
            failed + result 200 -> illegal
            failed + result 200 (accepted unrecorded) -> illegal
            failed + result 500 -> illegal
            failed + result 502 -> illegal
            failed + kill -> illegal
            failed + skip -> illegal
            failed + lost -> illegal
            failed + deadline passed -> illegal
            timed_out + claim -> illegal
            timed_out + sent -> illegal
            timed_out + not sent -> illegal
            timed_out + discard -> illegal
            timed_out + result 200 -> illegal
            timed_out + result 200 (accepted unrecorded) -> illegal
            timed_out + result 500 -> illegal
            timed_out + result 502 -> illegal
            timed_out + kill -> illegal
            timed_out + skip -> illegal
            timed_out + lost -> illegal
            timed_out + deadline passed -> illegal
            killed + claim -> illegal
            killed + sent -> illegal
            killed + not sent -> illegal
            killed + discard -> illegal
            killed + result 200 -> illegal
            killed + result 200 (accepted unrecorded) -> illegal
            killed + result 500 -> illegal
            killed + result 502 -> illegal
            killed + kill -> illegal
            killed + skip -> illegal
            killed + lost -> illegal
            killed + deadline passed -> illegal
            lost + claim -> illegal
            lost + sent -> illegal
            lost + not sent -> illegal
            lost + discard -> illegal
            lost + result 200 -> illegal
            lost + result 200 (accepted unrecorded) -> illegal
            lost + result 500 -> illegal
            lost + result 502 -> illegal
            lost + kill -> illegal
            lost + skip -> illegal
            lost + lost -> illegal
            lost + deadline passed -> illegal
            skipped + claim -> illegal
            skipped + sent -> illegal
            skipped + not sent -> illegal
            skipped + discard -> illegal
            skipped + result 200 -> illegal
            skipped + result 200 (accepted unrecorded) -> illegal
            skipped + result 500 -> illegal
            skipped + result 502 -> illegal
            skipped + kill -> illegal
            skipped + skip -> illegal
            skipped + lost -> illegal
            skipped + deadline passed -> illegal
        "#]],
    );
}

#[test]
fn a_kill_was_requested() {
    check(
        RunFacts { kill_requested: true, ..FIRST_TRY },
        Some(&JOB),
        expect![[r#"
            pending + claim -> dispatching
            pending + sent -> illegal
            pending + not sent -> illegal
            pending + discard -> skipped handle 200 `at its cap`
            pending + result 200 -> illegal
            pending + result 200 (accepted unrecorded) -> illegal
            pending + result 500 -> illegal
            pending + result 502 -> illegal
            pending + kill -> killed handle 500 `killed before it was sent`
            pending + skip -> skipped handle 200 `stopped`
            pending + lost -> illegal
            pending + deadline passed -> illegal
            dispatching + claim -> dispatching
            dispatching + sent -> running trigger 200, `sent to http://e1`, dispatched 1000 deadline 6100, +send kill
            dispatching + not sent -> killed trigger 500, `refused`, handle 500 `trigger failed: refused`
            dispatching + discard -> illegal
            dispatching + result 200 -> success trigger 200, dispatched 900 deadline 0, handle 200 `ok`, +children
            dispatching + result 200 (accepted unrecorded) -> success trigger 200, `sent to http://e1`, dispatched 850 deadline 0, handle 200 `ok`, +children
            dispatching + result 500 -> killed trigger 200, handle 500 `boom`
            dispatching + result 502 -> timed_out trigger 200, handle 502 `slow`, +retry
            dispatching + kill -> illegal
            dispatching + skip -> skipped handle 200 `stopped`
            dispatching + lost -> lost handle 500 `gone`, +retry, +send kill
            dispatching + deadline passed -> illegal
            running + claim -> illegal
            running + sent -> illegal
            running + not sent -> illegal
            running + discard -> illegal
            running + result 200 -> success handle 200 `ok`, +children
            running + result 200 (accepted unrecorded) -> success handle 200 `ok`, +children
            running + result 500 -> killed handle 500 `boom`
            running + result 502 -> timed_out handle 502 `slow`, +retry
            running + kill -> running +kill requested, +send kill
            running + skip -> illegal
            running + lost -> lost handle 500 `gone`, +retry, +send kill
            running + deadline passed -> timed_out handle 502 `timed out: no result within the job's timeout and the grace period`, +retry, +send kill
            success + claim -> illegal
            success + sent -> illegal
            success + not sent -> illegal
            success + discard -> illegal
            success + result 200 -> illegal
            success + result 200 (accepted unrecorded) -> illegal
            success + result 500 -> illegal
            success + result 502 -> illegal
            success + kill -> illegal
            success + skip -> illegal
            success + lost -> illegal
            success + deadline passed -> illegal
            failed + claim -> illegal
            failed + sent -> illegal
            failed + not sent -> illegal
            failed + discard -> illegal
            failed + result 200 -> illegal
            failed + result 200 (accepted unrecorded) -> illegal
            failed + result 500 -> illegal
            failed + result 502 -> illegal
            failed + kill -> illegal
            failed + skip -> illegal
            failed + lost -> illegal
            failed + deadline passed -> illegal
            timed_out + claim -> illegal
            timed_out + sent -> illegal
            timed_out + not sent -> illegal
            timed_out + discard -> illegal
            timed_out + result 200 -> illegal
            timed_out + result 200 (accepted unrecorded) -> illegal
            timed_out + result 500 -> illegal
            timed_out + result 502 -> illegal
            timed_out + kill -> illegal
            timed_out + skip -> illegal
            timed_out + lost -> illegal
            timed_out + deadline passed -> illegal
            killed + claim -> illegal
            killed + sent -> illegal
            killed + not sent -> illegal
            killed + discard -> illegal
            killed + result 200 -> illegal
            killed + result 200 (accepted unrecorded) -> illegal
            killed + result 500 -> illegal
            killed + result 502 -> illegal
            killed + kill -> illegal
            killed + skip -> illegal
            killed + lost -> illegal
            killed + deadline passed -> illegal
            lost + claim -> illegal
            lost + sent -> illegal
            lost + not sent -> illegal
            lost + discard -> illegal
            lost + result 200 -> illegal
            lost + result 200 (accepted unrecorded) -> illegal
            lost + result 500 -> illegal
            lost + result 502 -> illegal
            lost + kill -> illegal
            lost + skip -> illegal
            lost + lost -> illegal
            lost + deadline passed -> illegal
            skipped + claim -> illegal
            skipped + sent -> illegal
            skipped + not sent -> illegal
            skipped + discard -> illegal
            skipped + result 200 -> illegal
            skipped + result 200 (accepted unrecorded) -> illegal
            skipped + result 500 -> illegal
            skipped + result 502 -> illegal
            skipped + kill -> illegal
            skipped + skip -> illegal
            skipped + lost -> illegal
            skipped + deadline passed -> illegal
        "#]],
    );
}

#[test]
fn last_try_of_a_manual_run_whose_job_is_gone() {
    let run = RunFacts { attempt: 1, trigger_type: TriggerType::Manual, ..FIRST_TRY };
    check(
        run,
        None,
        expect![[r#"
            pending + claim -> dispatching
            pending + sent -> illegal
            pending + not sent -> illegal
            pending + discard -> skipped handle 200 `at its cap`
            pending + result 200 -> illegal
            pending + result 200 (accepted unrecorded) -> illegal
            pending + result 500 -> illegal
            pending + result 502 -> illegal
            pending + kill -> killed handle 500 `killed before it was sent`
            pending + skip -> illegal
            pending + lost -> illegal
            pending + deadline passed -> illegal
            dispatching + claim -> dispatching
            dispatching + sent -> running trigger 200, `sent to http://e1`, dispatched 1000 deadline 6100
            dispatching + not sent -> failed trigger 500, `refused`, handle 500 `trigger failed: refused`, +alarm
            dispatching + discard -> illegal
            dispatching + result 200 -> success trigger 200, dispatched 900 deadline 0, handle 200 `ok`
            dispatching + result 200 (accepted unrecorded) -> success trigger 200, `sent to http://e1`, dispatched 850 deadline 0, handle 200 `ok`
            dispatching + result 500 -> failed trigger 200, handle 500 `boom`, +alarm
            dispatching + result 502 -> timed_out trigger 200, handle 502 `slow`, +alarm
            dispatching + kill -> dispatching +kill requested
            dispatching + skip -> illegal
            dispatching + lost -> lost handle 500 `gone`, +send kill, +alarm
            dispatching + deadline passed -> illegal
            running + claim -> illegal
            running + sent -> illegal
            running + not sent -> illegal
            running + discard -> illegal
            running + result 200 -> success handle 200 `ok`
            running + result 200 (accepted unrecorded) -> success handle 200 `ok`
            running + result 500 -> failed handle 500 `boom`, +alarm
            running + result 502 -> timed_out handle 502 `slow`, +alarm
            running + kill -> running +kill requested, +send kill
            running + skip -> illegal
            running + lost -> lost handle 500 `gone`, +send kill, +alarm
            running + deadline passed -> timed_out handle 502 `timed out: no result within the job's timeout and the grace period`, +send kill, +alarm
            success + claim -> illegal
            success + sent -> illegal
            success + not sent -> illegal
            success + discard -> illegal
            success + result 200 -> illegal
            success + result 200 (accepted unrecorded) -> illegal
            success + result 500 -> illegal
            success + result 502 -> illegal
            success + kill -> illegal
            success + skip -> illegal
            success + lost -> illegal
            success + deadline passed -> illegal
            failed + claim -> illegal
            failed + sent -> illegal
            failed + not sent -> illegal
            failed + discard -> illegal
            failed + result 200 -> illegal
            failed + result 200 (accepted unrecorded) -> illegal
            failed + result 500 -> illegal
            failed + result 502 -> illegal
            failed + kill -> illegal
            failed + skip -> illegal
            failed + lost -> illegal
            failed + deadline passed -> illegal
            timed_out + claim -> illegal
            timed_out + sent -> illegal
            timed_out + not sent -> illegal
            timed_out + discard -> illegal
            timed_out + result 200 -> illegal
            timed_out + result 200 (accepted unrecorded) -> illegal
            timed_out + result 500 -> illegal
            timed_out + result 502 -> illegal
            timed_out + kill -> illegal
            timed_out + skip -> illegal
            timed_out + lost -> illegal
            timed_out + deadline passed -> illegal
            killed + claim -> illegal
            killed + sent -> illegal
            killed + not sent -> illegal
            killed + discard -> illegal
            killed + result 200 -> illegal
            killed + result 200 (accepted unrecorded) -> illegal
            killed + result 500 -> illegal
            killed + result 502 -> illegal
            killed + kill -> illegal
            killed + skip -> illegal
            killed + lost -> illegal
            killed + deadline passed -> illegal
            lost + claim -> illegal
            lost + sent -> illegal
            lost + not sent -> illegal
            lost + discard -> illegal
            lost + result 200 -> illegal
            lost + result 200 (accepted unrecorded) -> illegal
            lost + result 500 -> illegal
            lost + result 502 -> illegal
            lost + kill -> illegal
            lost + skip -> illegal
            lost + lost -> illegal
            lost + deadline passed -> illegal
            skipped + claim -> illegal
            skipped + sent -> illegal
            skipped + not sent -> illegal
            skipped + discard -> illegal
            skipped + result 200 -> illegal
            skipped + result 200 (accepted unrecorded) -> illegal
            skipped + result 500 -> illegal
            skipped + result 502 -> illegal
            skipped + kill -> illegal
            skipped + skip -> illegal
            skipped + lost -> illegal
            skipped + deadline passed -> illegal
        "#]],
    );
}

#[test]
fn illegal_events_are_refused_by_name() {
    let done = RunFacts { state: RunState::Success, ..FIRST_TRY };
    let refused = transition(&done, Some(&JOB), &Event::Kill).unwrap_err();
    assert_eq!(refused.to_string(), "kill does not apply to a success run");
    let terminal: Vec<_> = RunState::ALL.iter().filter(|state| state.is_terminal()).collect();
    for state in terminal {
        for event in events() {
            let run = RunFacts { state: *state, ..FIRST_TRY };
            assert!(transition(&run, Some(&JOB), &event).is_err(), "{state} + {event:?}");
        }
    }
}

#[test]
fn messages_are_cleaned() {
    assert_eq!(clean_message("a\0b"), "a\u{fffd}b");
    let long = "é".repeat(MAX_MESSAGE_BYTES);
    let cut = clean_message(&long);
    assert!(cut.len() <= MAX_MESSAGE_BYTES && cut.len() >= MAX_MESSAGE_BYTES - 1);
}

#[test]
fn before_a_send() {
    const HOUR: i64 = RESEND_WINDOW_MS;
    let on = Some(JobNow { running: true, fires_again: true });
    let stopped = Some(JobNow { running: false, fires_again: true });
    let stopped_by_its_last_fire = Some(JobNow { running: false, fires_again: false });
    // (scheduled, job, fence, since the first claim) → what happens instead of the send.
    let table = [
        (true, on, 1, 0, None),
        (false, on, 1, 0, None),
        (true, stopped, 1, 0, Some("skip")),
        (false, stopped, 1, 0, None),
        (true, stopped_by_its_last_fire, 1, 0, None),
        (true, None, 1, 0, Some("not sent")),
        (false, None, 2, HOUR + 1, Some("not sent")),
        (true, on, 2, HOUR, None),
        (true, on, 2, HOUR + 1, Some("lost")),
        (false, on, 1, HOUR + 1, None),
        (true, stopped, 2, HOUR + 1, Some("skip")),
    ];
    for (scheduled, job, fence, since_first_claim_ms, expected) in table {
        let facts = SendFacts { job_id: 7, scheduled, job, fence, since_first_claim_ms };
        let decided = before_send(&facts);
        assert_eq!(decided.as_ref().map(Event::name), expected, "{facts:?}");
    }
    let gone =
        SendFacts { job_id: 7, scheduled: true, job: None, fence: 1, since_first_claim_ms: 0 };
    assert_eq!(
        before_send(&gone),
        Some(Event::NotSent { reason: "job 7 no longer exists".to_owned() })
    );
}
