// BullMQ's drain rate, the queue that workload (c) of `cargo bench --bench e2e` is compared with:
// 32 producers add 100,000 jobs to one queue while one Worker of concurrency 64 runs them, on
// BullMQ's defaults; it prints the jobs drained per second (first add to last completion) and
// Node's CPU time per job (Redis's is not counted).
//
// Not part of the build or CI. To run it beside the bench, on the same machine:
//   cd benches/bullmq && npm install --no-save bullmq@5 && node drain.js
// with Redis at 127.0.0.1:6379 (REDIS_PORT to change the port). It makes a queue of its own and
// removes it at the end.
const { Queue, Worker } = require('bullmq');

const connection = { host: '127.0.0.1', port: Number(process.env.REDIS_PORT || 6379) };
const JOBS = 100000;
const PRODUCERS = 32;

(async () => {
  const name = `drain-${process.pid}-${Date.now()}`;
  const queue = new Queue(name, { connection });
  let completed = 0;
  let drained;
  const all = new Promise((resolve) => { drained = resolve; });
  const worker = new Worker(name, async (job) => job.data.i, { connection, concurrency: 64 });
  worker.on('completed', () => { if (++completed === JOBS) drained(); });
  const started = Date.now();
  const cpu = process.cpuUsage();
  await Promise.all(Array.from({ length: PRODUCERS }, async (_, producer) => {
    for (let i = producer; i < JOBS; i += PRODUCERS) await queue.add('job', { i });
  }));
  await all;
  const seconds = (Date.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  console.log(`bullmq.jobs_per_sec: ${(JOBS / seconds).toFixed(0)}`);
  console.log(`bullmq.node_cpu_us_per_job: ${((used.user + used.system) / JOBS).toFixed(1)}`);
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  process.exit(0);
})();
