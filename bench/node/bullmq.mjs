// The BullMQ contender of bench/cmd/dispatch's ceiling section. Two modes:
//
//   node bullmq.mjs fill --redis URL --queue NAME --jobs N --payload JSON
//     adds N jobs carrying the payload with Queue.addBulk, prints
//     "filled N" and exits.
//   node bullmq.mjs work --redis URL --queue NAME --concurrency N [--url BASE]
//     runs one Worker with that concurrency. Its processor notes the time
//     and returns; with --url it first sends the job's request (the job is
//     shaper's queue.Job as JSON, body in base64) to BASE and reads the
//     answer.
//
// The worker talks to its parent on stdout, as the Go children of
// cmd/dispatch do: "startcpu <µs>" (the CPU this process used getting
// ready: starting node, loading BullMQ, connecting), then "ready"; when it
// stops, a line "t <unix ns>" per job it ran, then "end <jobs>". Writing
// the times at the end costs nothing while it is being measured. It starts
// taking jobs when the line "go" arrives on stdin, so that the second or so
// node takes to start is not inside the drain (a Go child is ready in
// milliseconds), and stops on SIGTERM, SIGINT or when its stdin closes (as
// it does when the parent dies).

import http from 'node:http';
import { performance } from 'node:perf_hooks';
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

function parseArgs(argv) {
  const opts = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--') || i + 1 >= argv.length) {
      throw new Error(`unexpected argument ${JSON.stringify(a)}`);
    }
    opts[a.slice(2)] = argv[++i];
  }
  for (const k of ['redis', 'queue']) {
    if (!opts[k]) throw new Error(`--${k} is required`);
  }
  return opts;
}

function positive(opts, k) {
  const n = Number(opts[k]);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${k}: want a positive integer, got ${JSON.stringify(opts[k])}`);
  return n;
}

// BullMQ wants maxRetriesPerRequest null on a worker's connections.
function connect(url) {
  return new IORedis(url, { maxRetriesPerRequest: null });
}

async function fill(opts) {
  const jobs = positive(opts, 'jobs');
  const data = JSON.parse(opts.payload ?? '{}');
  const conn = connect(opts.redis);
  const queue = new Queue(opts.queue, { connection: conn });
  const chunk = 1000;
  for (let i = 0; i < jobs; i += chunk) {
    const batch = [];
    for (let j = i; j < Math.min(jobs, i + chunk); j++) batch.push({ name: 'bench:noop', data });
    await queue.addBulk(batch);
  }
  await queue.close();
  await conn.quit();
  process.stdout.write(`filled ${jobs}\n`);
}

// Nanoseconds since the epoch, from the monotonic clock set once against
// the wall clock, so that processes' times can be merged.
const wallAtStart = BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
const hrAtStart = process.hrtime.bigint();
const nowNs = () => wallAtStart + (process.hrtime.bigint() - hrAtStart);

// send is what a BullMQ worker calling an API does: send the job's request
// with node's own HTTP client (keep-alive) and read the answer.
function sender(base, concurrency) {
  const agent = new http.Agent({ keepAlive: true, maxFreeSockets: 2 * concurrency });
  return (job) => new Promise((resolve, reject) => {
    const d = job.data;
    const headers = { ...(d.headers ?? {}), 'Idempotency-Key': d.idempotency_key ?? '' };
    const body = d.body ? Buffer.from(d.body, 'base64') : Buffer.alloc(0);
    headers['Content-Length'] = String(body.length);
    const req = http.request(base + (d.path ?? '/'), { method: d.method || 'GET', headers, agent }, (res) => {
      res.on('data', () => {});
      res.on('end', () => {
        if (res.statusCode !== 200) reject(new Error(`upstream answered ${res.statusCode}`));
        else resolve();
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function work(opts) {
  const concurrency = positive(opts, 'concurrency');

  const times = [];
  const send = opts.url ? sender(opts.url, concurrency) : null;
  const processor = send
    ? async (job) => { await send(job); times.push(nowNs()); }
    : async () => { times.push(nowNs()); };
  const conn = connect(opts.redis);
  const worker = new Worker(opts.queue, processor, { connection: conn, concurrency, autorun: false });
  worker.on('error', (err) => process.stderr.write(`worker error: ${err.stack ?? err}\n`));
  worker.on('failed', (job, err) => process.stderr.write(`job ${job?.id} failed: ${err.message}\n`));
  await worker.waitUntilReady();
  const cpu = process.cpuUsage();
  process.stdout.write(`startcpu ${cpu.user + cpu.system}\nready\n`);

  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await worker.close();
    await conn.quit();
    let out = '';
    for (const t of times) out += `t ${t}\n`;
    out += `end ${times.length}\n`;
    process.stdout.write(out, () => process.exit(0));
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  let input = '';
  let running = false;
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (chunk) => {
    input += chunk;
    if (!running && input.split('\n').includes('go')) {
      running = true;
      worker.run().catch((err) => process.stderr.write(`worker run: ${err.stack ?? err}\n`));
    }
  });
  process.stdin.on('end', stop);
  process.stdin.on('close', stop);
}

const [mode, ...rest] = process.argv.slice(2);
const run = { fill, work }[mode];
if (!run) {
  process.stderr.write('usage: node bullmq.mjs fill|work --redis URL --queue NAME …\n');
  process.exit(2);
}
run(parseArgs(rest)).catch((err) => {
  process.stderr.write(`bullmq ${mode}: ${err.stack ?? err}\n`);
  process.exit(1);
});
