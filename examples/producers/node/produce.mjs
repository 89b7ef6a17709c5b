#!/usr/bin/env node
// Enqueue one call through shaper and print its result.
//
// Node 20 or later, built-in fetch only. The call is enqueued with
// POST /v1/jobs; a 429 (admission limit) or 503 (backlog full, store
// unavailable) is waited out for as long as its Retry-After says, then the
// job is read back with long polls, GET /v1/jobs/{id}?wait=20s, which the
// server answers as soon as the job is finished (or when the 20 s are up,
// and the next one waits again): no polling loop. It is printed as JSON.
//
//   SHAPER_API_URL=http://localhost:8080 SHAPER_API_KEY=... \
//     node produce.mjs --upstream stripe --path /v1/charges --body 'amount=100'
//
// Exit status: 0 when the job succeeded, 1 when it ended otherwise (dead or
// cancelled: the job is printed all the same), 2 on an error.

import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";

const FINAL_STATES = new Set(["succeeded", "dead", "cancelled"]);
const USER_AGENT = "shaper-example-node";
// How long one long poll asks the server to wait (it allows up to 60 s; a
// proxy in between may cut idle requests sooner).
const WAIT_WINDOW = 20;

class APIError extends Error {
  constructor(status, problem) {
    const errors = (problem.errors ?? []).map((e) => `${e.field}: ${e.message}`).join("; ");
    super(`${status} ${problem.detail ?? problem.title ?? ""}${errors ? ` (${errors})` : ""}`);
    this.status = status;
    this.problem = problem;
  }
}

// retryAfterSeconds reads Retry-After: delay seconds, or an HTTP date; null
// when absent or unreadable.
function retryAfterSeconds(value) {
  if (!value) return null;
  const secs = Number(value.trim());
  if (Number.isFinite(secs)) return Math.max(0, secs);
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, (when - Date.now()) / 1000);
}

const sleep = (secs) => new Promise((resolve) => setTimeout(resolve, secs * 1000));

// call makes one API call, waiting out 429 and 503 as the server asks, and
// returns [status, parsed JSON body].
async function call(api, key, method, path, body, deadline, timeoutSecs = 30) {
  const headers = {
    Authorization: `Bearer ${key}`,
    Accept: "application/json, application/problem+json",
    "User-Agent": USER_AGENT,
  };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  for (let attempt = 0; ; attempt++) {
    const resp = await fetch(api.replace(/\/+$/, "") + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutSecs * 1000),
    });
    const text = await resp.text();
    let parsed;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = { detail: text };
    }
    if (resp.ok) return [resp.status, parsed];
    if (resp.status !== 429 && resp.status !== 503) throw new APIError(resp.status, parsed);
    // No time named (a proxy's 503, say): back off on our own.
    const wait = retryAfterSeconds(resp.headers.get("Retry-After")) ?? Math.min(2 ** attempt, 30);
    if (deadline !== undefined && Date.now() + wait * 1000 > deadline) throw new APIError(resp.status, parsed);
    console.error(`${method} ${path}: ${resp.status} ${parsed.title ?? ""}; retrying in ${wait}s`);
    await sleep(wait);
  }
}

async function main() {
  const { values: args } = parseArgs({
    options: {
      api: { type: "string", default: process.env.SHAPER_API_URL ?? "http://localhost:8080" },
      key: { type: "string", default: process.env.SHAPER_API_KEY },
      upstream: { type: "string" },
      path: { type: "string" },
      method: { type: "string" },
      body: { type: "string" },
      header: { type: "string", multiple: true, default: [] },
      "idempotency-key": { type: "string" },
      timeout: { type: "string", default: "300" },
    },
  });
  if (!args.key || !args.upstream || !args.path) {
    console.error("usage: node produce.mjs --upstream NAME --path /PATH [--method M] [--body TEXT] " +
      "[--header NAME:VALUE]... [--idempotency-key K] [--timeout SECONDS] [--api URL] [--key KEY]\n" +
      "(--key defaults to $SHAPER_API_KEY, --api to $SHAPER_API_URL)");
    return 2;
  }
  // A random idempotency key by default, so that a retried enqueue cannot
  // make a second job.
  const job = { upstream: args.upstream, path: args.path, idempotency_key: args["idempotency-key"] ?? `example-${randomUUID()}` };
  if (args.method) job.method = args.method;
  if (args.body !== undefined) job.body = args.body;
  if (args.header.length > 0) {
    job.headers = Object.fromEntries(args.header.map((h) => {
      const i = h.indexOf(":");
      return [h.slice(0, i).trim(), h.slice(i + 1).trim()];
    }));
  }
  const timeout = Number(args.timeout);
  const deadline = Date.now() + timeout * 1000;

  let got;
  try {
    const [status, accepted] = await call(args.api, args.key, "POST", "/v1/jobs", job, deadline);
    console.error(`enqueued ${accepted.id} (${status === 202 ? "new" : "existing"})`);
    const path = `/v1/jobs/${encodeURIComponent(accepted.id)}`;
    for (;;) {
      const left = (deadline - Date.now()) / 1000;
      if (left <= 0) {
        console.error(`job ${accepted.id} still ${got?.state ?? accepted.state} after ${timeout}s`);
        return 2;
      }
      const window = Math.max(1, Math.min(WAIT_WINDOW, Math.floor(left)));
      const asked = Date.now();
      // The request's timeout leaves room for the answer after the wait.
      [, got] = await call(args.api, args.key, "GET", `${path}?wait=${window}s`, undefined, deadline, window + 10);
      if (FINAL_STATES.has(got.state)) break;
      console.error(`job ${accepted.id} is ${got.state}; waiting`);
      // Answered early (the server is shutting down): do not turn that
      // into a busy loop.
      if (Date.now() - asked < (window * 1000) / 2) await sleep(1);
    }
  } catch (err) {
    console.error(`error: ${err.message}`);
    return 2;
  }
  console.log(JSON.stringify(got, null, 2));
  return got.state === "succeeded" ? 0 : 1;
}

process.exitCode = await main();
