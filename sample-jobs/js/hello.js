// `hello` in JavaScript: the smallest well-behaved job, as a GLUE_JAVASCRIPT handler.
//
// Contract (the job world of wit/job.wit, as componentize-js presents it):
// - the module exports a function `run(t)`; `t` is the trigger (`t.jobId`, `t.logId`,
//   `t.param`, `t.shardIndex`, `t.shardTotal`, `t.triggerTimeMs` and `t.logId` are BigInts
//   or numbers as the WIT types say: s64 fields are BigInts, u32 ones numbers; `t.attempt`);
// - returning a string ends the run as a success with that handle message;
// - throwing a string ends it as a failure with that message;
// - `log(level, text)` from `wasmjob:job/log@0.1.0` appends a line to the run's log, with level
//   one of "trace", "debug", "info", "warn", "error"; `console.log` goes there as well.
//
// Here: param = a name (empty means `world`). Logs `hello, <name>` at info level and returns
// `hello, <name>`; the param `fail` makes it fail with `asked to fail`.
import { log } from "wasmjob:job/log@0.1.0";

export function run(t) {
  if (t.param === "fail") {
    throw "asked to fail";
  }
  const message = `hello, ${t.param || "world"}`;
  log("info", message);
  return message;
}
