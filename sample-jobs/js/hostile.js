// `hostile` in JavaScript: one handler that tries, by its param, what a sandboxed script must
// not be able to do, so that one build covers every containment case.
//
// Contract: param = `<probe>` or `<probe>:<argument>`. Each probe logs `probing <probe>` first.
// - `loop`: computes forever; ends only when the host stops it (fuel or deadline).
// - `bomb`: allocates 1 MiB arrays forever; ends when memory growth is refused.
// - `wait:<ms>`: waits that long by reading the clock (JavaScript has no blocking sleep), then
//   returns `waited <ms> ms`.
// - `reach`: lists which of `fetch`, `require`, `process`, `Deno` and `Bun` exist. Under
//   componentize-js only `fetch` does (its runtime defines it), and the component imports no
//   `wasi:http`, so it has nothing to send a request through: `reach: fetch`.
import { log } from "wasmjob:job/log@0.1.0";

export function run(t) {
  const [probe, argument] = t.param.split(":");
  log("info", `probing ${probe}`);
  if (probe === "loop") {
    let n = 0;
    for (;;) {
      n += 1;
    }
  }
  if (probe === "bomb") {
    const blocks = [];
    for (;;) {
      blocks.push(new Uint8Array(1024 * 1024).fill(1));
    }
  }
  if (probe === "wait") {
    const until = Date.now() + Number(argument);
    while (Date.now() < until) {
      // Spins on the clock.
    }
    return `waited ${argument} ms`;
  }
  if (probe === "reach") {
    const names = ["fetch", "require", "process", "Deno", "Bun"];
    const found = names.filter((name) => typeof globalThis[name] !== "undefined");
    return `reach: ${found.length ? found.join(",") : "none"}`;
  }
  throw `unknown probe \`${probe}\``;
}
