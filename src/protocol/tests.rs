//! Tests of `protocol`.

use super::*;

#[test]
fn trigger_param_reads_xxl_job_json() {
    let json = r#"{"jobId":7,"executorHandler":"demoJobHandler","executorParams":"x",
        "executorBlockStrategy":"SERIAL_EXECUTION","executorTimeout":0,"logId":42,
        "logDateTime":1700000000000,"glueType":"BEAN","glueSource":"","glueUpdatetime":0,
        "broadcastIndex":0,"broadcastTotal":1,"somethingNew":true}"#;
    let param: TriggerParam = serde_json::from_str(json).unwrap();
    assert_eq!((param.job_id, param.log_id, param.attempt), (7, 42, None));
    let wrong = serde_json::from_str::<TriggerParam>(r#"{"jobId":"seven"}"#).unwrap_err();
    assert!(wrong.to_string().contains("invalid type"), "{wrong}");
}

#[test]
fn sharding_items_travel_only_when_there_are_some() {
    let plain = serde_json::to_string(&TriggerParam::default()).unwrap();
    assert!(!plain.contains("shardingItems"), "{plain}");
    let items = vec![ShardingItemParam { item: 2, parameter: "Guangzhou".to_owned() }];
    let sharded = TriggerParam { sharding_items: Some(items.clone()), ..TriggerParam::default() };
    let json = serde_json::to_string(&sharded).unwrap();
    assert!(json.contains(r#""shardingItems":[{"item":2,"parameter":"Guangzhou"}]"#), "{json}");
    let read: TriggerParam = serde_json::from_str(&json).unwrap();
    assert_eq!(read.sharding_items, Some(items));
}

#[test]
fn callback_body_takes_both_forms() {
    let bare = r#"[{"logId":1,"logDateTim":5,"handleCode":200,"handleMsg":"ok"}]"#;
    let wrapped = r#"{"callbackList":[{"logId":1,"logDateTim":5,"handleCode":200}]}"#;
    for json in [bare, wrapped] {
        let list = serde_json::from_str::<CallbackBody>(json).unwrap().into_list();
        assert_eq!((list[0].log_id, list[0].handle_code), (1, 200));
    }
    let old = r#"[{"logId":2,"logDateTim":5,"executeResult":{"code":500,"msg":"boom"}}]"#;
    let list = serde_json::from_str::<CallbackBody>(old).unwrap().into_list();
    assert_eq!(list[0].code_and_msg(), (500, "boom".to_owned()));
}

#[test]
fn callbacks_are_written_for_every_generation() {
    // 2.2 admins read `executeResult.code`, 2.3 to 3.4 `handleCode` and `logDateTim`, 3.5
    // `logDateTime`: every entry carries all of them.
    let result = HandleCallbackParam {
        log_id: 9,
        log_date_tim: 5,
        handle_code: 500,
        handle_msg: Some("boom".to_owned()),
        ..HandleCallbackParam::default()
    };
    let json = serde_json::to_string(&result).unwrap();
    assert_eq!(
        json,
        r#"{"logId":9,"logDateTim":5,"logDateTime":5,"handleCode":500,"handleMsg":"boom","executeResult":{"code":500,"msg":"boom"}}"#
    );
    let read: HandleCallbackParam = serde_json::from_str(&json).unwrap();
    assert_eq!(read.code_and_msg(), (500, "boom".to_owned()));
    let wrapped = serde_json::to_value(CallbackList { callback_list: &[&result] }).unwrap();
    assert_eq!(wrapped["callbackList"][0]["executeResult"]["code"], 500);
}

#[test]
fn log_requests_name_the_time_both_ways() {
    let param = LogParam { log_date_tim: 7, log_id: 3, from_line_num: 1 };
    let json = serde_json::to_string(&param).unwrap();
    assert_eq!(json, r#"{"logDateTim":7,"logDateTime":7,"logId":3,"fromLineNum":1}"#);
    let new: LogParam =
        serde_json::from_str(r#"{"logDateTime":7,"logId":3,"fromLineNum":1}"#).unwrap();
    assert_eq!(new, param);
}

#[test]
fn generations_parse() {
    let parsed: Vec<_> = ["classic", "2.2", "3.4", "3.5", "3.6"]
        .iter()
        .map(|text| text.parse::<Generation>().map(|g| g.trigger_path()))
        .collect();
    assert_eq!(parsed[..4], [Ok("run"), Ok("run"), Ok("run"), Ok("trigger")]);
    assert!(parsed[4].as_ref().is_err_and(|error| error.contains("`3.6`")));
}

#[test]
fn one_bad_callback_entry_does_not_sink_the_batch() {
    let body = br#"[{"logId":1,"handleCode":200,"handleMsg":"lone \ud800 here"},
        {"logId":2,"handleCode":"x"},
        {"logId":3,"handleCode":500,"handleMsg":"pair \ud83d\ude00 and \\ud800 literal"}]"#;
    let parsed = parse_callbacks(body).unwrap();
    let messages: Vec<_> =
        parsed.results.iter().map(|r| (r.log_id, r.handle_msg.clone().unwrap())).collect();
    assert_eq!(
        messages,
        [
            (1, "lone \u{fffd} here".to_owned()),
            (3, "pair \u{1f600} and \\ud800 literal".to_owned())
        ]
    );
    assert_eq!(parsed.refused.len(), 1, "{:?}", parsed.refused);
    assert!(parsed.refused[0].starts_with("logId 2:"), "{:?}", parsed.refused);
    let invalid_utf8 = b"[{\"logId\":4,\"handleCode\":500,\"handleMsg\":\"\xff\"}]";
    let parsed = parse_callbacks(invalid_utf8).unwrap();
    assert_eq!(parsed.results[0].handle_msg.as_deref(), Some("\u{fffd}"));
    assert!(parse_callbacks(b"{\"x\":1}").is_err());
}

/// Which bodies are a batch, and how many of their entries are read and refused.
#[test]
fn a_callback_body_is_a_batch_only_as_an_array_or_a_callback_list() {
    let table = [
        ("[]", Ok((0, 0))),
        (" \n [{\"logId\":1,\"handleCode\":200}] ", Ok((1, 0))),
        (r#"{"callbackList":[{"logId":1},{"logId":[]},{"logId":3}],"x":1}"#, Ok((2, 1))),
        (r#"{"x":[1],"callbackList":[]}"#, Ok((0, 0))),
        (r#"[1, "two", {"logId":3}]"#, Ok((1, 2))),
        (r#"{"callbackList":null}"#, Err("expected an array or {callbackList")),
        (r#"{"callbackList":{"logId":1}}"#, Err("expected an array or {callbackList")),
        ("{}", Err("expected an array or {callbackList")),
        ("42", Err("expected an array or {callbackList")),
        (r#""[]""#, Err("expected an array or {callbackList")),
        ("[{\"logId\":1}", Err("invalid request body: EOF")),
        ("", Err("invalid request body: EOF")),
    ];
    for (body, expected) in table {
        let parsed = parse_callbacks(body.as_bytes());
        match (parsed, expected) {
            (Ok(parsed), Ok((results, refused))) => {
                assert_eq!(
                    (parsed.results.len(), parsed.refused.len()),
                    (results, refused),
                    "{body}"
                );
            }
            (Err(reason), Err(expected)) => assert!(reason.contains(expected), "{body}: {reason}"),
            (parsed, expected) => panic!("{body}: {parsed:?}, expected {expected:?}"),
        }
    }
    let parsed = parse_callbacks(br#"[{"logId":"seven"},{"handleCode":1}]"#).unwrap();
    assert!(parsed.refused[0].starts_with(r#"logId "seven": invalid type"#), "{parsed:?}");
    assert_eq!(parsed.results[0].log_id, 0, "a missing field takes its default, as before");
}

#[test]
fn envelope_payload_from_content_or_data() {
    let old: ReturnT<i32> = serde_json::from_str(r#"{"code":200,"content":3}"#).unwrap();
    let new: ReturnT<i32> = serde_json::from_str(r#"{"code":200,"data":4}"#).unwrap();
    assert_eq!((old.into_payload(), new.into_payload()), (Some(3), Some(4)));
    let sent = serde_json::to_string(&ReturnT::ok(5)).unwrap();
    assert_eq!(sent, r#"{"code":200,"content":5,"data":5}"#);
}
