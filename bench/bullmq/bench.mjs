// The BullMQ side of bench/vs_bullmq.py: the same workloads, driven from Python, measured the
// same way. Installed here with `npm install` (bench/vs_bullmq.py does it), never in the package.
//
//   node bench.mjs enqueue <url> <n>            one queue.add at a time; prints {"rate": ...}
//   node bench.mjs bulk <url> <n>               queue.addBulk in batches of 1,000
//   node bench.mjs fill <url> <n> <task>        pause the queue, add n jobs (bulk), exit
//   node bench.mjs worker <url> <concurrency> <task>
//                                               resume the queue once ready, print {"t0": ms},
//                                               work until SIGTERM
//   node bench.mjs latency <url> <n> <gap ms>   with a `worker ... stamp` running idle: add n jobs
//                                               one at a time, <gap ms> apart; prints each one's
//                                               {"start": ms from before its add to its handler's
//                                               start, "claim": processedOn - timestamp}
//   node bench.mjs drain <url> <n> <concurrency>
//                                               add n no-op jobs (bulk) and work them off in
//                                               this process; prints {"seconds": ...} from the
//                                               first add to the last completion
//   node bench.mjs flow <url> <n> <concurrency>
//                                               a FlowProducer flow: a parent whose n children
//                                               (no-ops in another queue) it gathers with
//                                               getChildrenValues(); the same timing, to the
//                                               parent's completion (bench/workflows.py)
//
//   node bench.mjs list <url> <n> <page>      n no-op jobs drained (bulk adds, concurrency 50,
//                                               completed jobs kept), then every page of
//                                               getJobs(['completed']) of <page> jobs; prints
//                                               each page's ms (bench/listing.py)
//
// <url> is redis://host:port or unix:///path/to/socket. <task> is noop or incr (one INCR on
// the task's own connection: the I/O a real task does) or stamp (returns when it started, ms).
import { FlowProducer, Job, Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

const QUEUE = 'bench';
const COUNTER = 'bench:count';
const BATCH = 1000;

function connection(url) {
  const options = { maxRetriesPerRequest: null, enableAutoPipelining: false };
  if (url.startsWith('unix://')) return new IORedis({ ...options, path: url.slice('unix://'.length) });
  return new IORedis(url, options);
}

function now() { return performance.timeOrigin + performance.now(); } // wall clock, ms

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

function say(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

async function enqueue(url, n) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.waitUntilReady();
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await queue.add('noop', { i });
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  say({ rate: n / seconds, seconds });
  await queue.close();
}

function jobs(from, to, task) {
  const out = [];
  for (let i = from; i < to; i++) out.push({ name: task, data: { i } });
  return out;
}

async function bulk(url, n) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.waitUntilReady();
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i += BATCH) await queue.addBulk(jobs(i, Math.min(i + BATCH, n), 'noop'));
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  say({ rate: n / seconds, seconds });
  await queue.close();
}

async function fill(url, n, task) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.pause();
  for (let i = 0; i < n; i += BATCH) await queue.addBulk(jobs(i, Math.min(i + BATCH, n), task));
  say({ added: n });
  await queue.close();
}

async function work(url, concurrency, task) {
  const io = connection(url);
  const handlers = {
    noop: async () => null,
    incr: async () => io.incr(COUNTER),
    stamp: async () => now(),
  };
  const handler = handlers[task];
  if (!handler) throw new Error(`unknown task ${task}`);
  const worker = new Worker(QUEUE, handler, { connection: connection(url), concurrency });
  await worker.waitUntilReady();
  const queue = new Queue(QUEUE, { connection: connection(url) });
  const t0 = Date.now();
  await queue.resume();
  say({ t0 });
  const stop = async () => {
    await worker.close();
    await queue.close();
    io.disconnect();
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

async function latency(url, n, gapMs) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.waitUntilReady();
  const sent = [];
  for (let i = 0; i < n; i++) {
    const t = now();
    sent.push([t, (await queue.add('stamp', { i })).id]);
    await sleep(gapMs);
  }
  const deadline = Date.now() + 30000;
  while ((await queue.getCompletedCount()) < n) {
    if (Date.now() > deadline) throw new Error('latency: the jobs were not all done in 30 s');
    await sleep(20);
  }
  const start = [];
  const claim = [];
  for (const [t, id] of sent) {
    const job = await Job.fromId(queue, id);
    start.push(job.returnvalue - t);
    claim.push(job.processedOn - job.timestamp);
  }
  say({ start, claim });
  await queue.close();
}

async function drain(url, n, concurrency) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.waitUntilReady();
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i += BATCH) await queue.addBulk(jobs(i, Math.min(i + BATCH, n), 'noop'));
  const worker = new Worker(QUEUE, async (job) => job.data.i, {
    connection: connection(url), concurrency,
  });
  worker.on('completed', () => { done += 1; if (done === n) finish(); });
  await finished;
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  say({ seconds, rate: n / seconds });
  await worker.close();
  await queue.close();
}

async function flow(url, n, concurrency) {
  const producer = new FlowProducer({ connection: connection(url) });
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  let gathered = -1;
  const children = new Worker('children', async (job) => job.data.i, {
    connection: connection(url), concurrency,
  });
  const parent = new Worker('parent', async (job) => {
    const values = await job.getChildrenValues();
    gathered = Object.keys(values).length;
    return gathered;
  }, { connection: connection(url), concurrency });
  parent.on('completed', () => finish());
  await children.waitUntilReady();
  await parent.waitUntilReady();
  const start = process.hrtime.bigint();
  const kids = [];
  for (let i = 0; i < n; i++) kids.push({ name: 'noop', queueName: 'children', data: { i } });
  await producer.add({ name: 'gather', queueName: 'parent', data: {}, children: kids });
  await finished;
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  if (gathered !== n) throw new Error(`the parent gathered ${gathered} of ${n} results`);
  say({ seconds, rate: n / seconds });
  await children.close();
  await parent.close();
  await producer.close();
}

async function list(url, n, size) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.waitUntilReady();
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  for (let i = 0; i < n; i += BATCH) await queue.addBulk(jobs(i, Math.min(i + BATCH, n), 'noop'));
  const worker = new Worker(QUEUE, async (job) => job.data.i, {
    connection: connection(url), concurrency: 50,
  });
  worker.on('completed', () => { done += 1; if (done === n) finish(); });
  await finished;
  await worker.close();
  const times = [];
  let rows = 0;
  for (let start = 0; ; start += size) {
    const t = process.hrtime.bigint();
    const page = await queue.getJobs(['completed'], start, start + size - 1);
    times.push(Number(process.hrtime.bigint() - t) / 1e6);
    rows += page.length;
    if (page.length < size) break;
  }
  say({ times, rows, total: await queue.getCompletedCount() });
  await queue.close();
}

const [command, url, a, b] = process.argv.slice(2);
const commands = {
  enqueue: () => enqueue(url, Number(a)),
  bulk: () => bulk(url, Number(a)),
  fill: () => fill(url, Number(a), b),
  worker: () => work(url, Number(a), b),
  latency: () => latency(url, Number(a), Number(b)),
  drain: () => drain(url, Number(a), Number(b)),
  flow: () => flow(url, Number(a), Number(b)),
  list: () => list(url, Number(a), Number(b)),
};
if (!commands[command] || !url) {
  process.stderr.write('usage: node bench.mjs enqueue|bulk|fill|worker|latency|drain|flow|list <url> ...\n');
  process.exit(2);
}
commands[command]().then(
  () => { if (command !== 'worker') process.exit(0); },
  (err) => { process.stderr.write(String(err && err.stack || err) + '\n'); process.exit(1); },
);
