#!/usr/bin/env python3
"""Enqueue one call through shaper and print its result.

Standard library only (urllib). The call is enqueued with POST /v1/jobs; a
429 (admission limit) or 503 (backlog full, store unavailable) is waited out
for as long as its Retry-After says, then the job is read back with long
polls, GET /v1/jobs/{id}?wait=20s, which the server answers as soon as the job
is finished (or when the 20 s are up, and the next one waits again): no
polling loop. It is printed as JSON.

    SHAPER_API_URL=http://localhost:8080 SHAPER_API_KEY=... \
        python3 produce.py --upstream stripe --path /v1/charges --body 'amount=100'

Exit status: 0 when the job succeeded, 1 when it ended otherwise (dead or
cancelled: the job is printed all the same), 2 on an error.
"""

import argparse
import email.utils
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

FINAL_STATES = {"succeeded", "dead", "cancelled"}
# How long one long poll asks the server to wait (it allows up to 60 s; a
# proxy in between may cut idle requests sooner).
WAIT_WINDOW = 20
USER_AGENT = "shaper-example-python"


class APIError(Exception):
    """A refusal the producer does not wait out (400, 401, 404, ...)."""

    def __init__(self, status, problem):
        self.status, self.problem = status, problem
        detail = problem.get("detail") or problem.get("title") or ""
        errors = "; ".join(f"{e['field']}: {e['message']}" for e in problem.get("errors", []))
        super().__init__(f"{status} {detail}" + (f" ({errors})" if errors else ""))


def retry_after_seconds(value):
    """Read Retry-After: delay seconds, or an HTTP date. None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def call(api, key, method, path, body=None, deadline=None, timeout=30):
    """One API call, waiting out 429 and 503 as the server asks.

    Returns (status, parsed JSON body).
    """
    data = None if body is None else json.dumps(body).encode()
    attempt = 0
    while True:
        req = urllib.request.Request(api.rstrip("/") + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + key)
        req.add_header("Accept", "application/json, application/problem+json")
        req.add_header("User-Agent", USER_AGENT)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                problem = json.loads(raw)
            except ValueError:
                problem = {"detail": raw.decode(errors="replace")}
            if err.code not in (429, 503):
                raise APIError(err.code, problem) from None
            wait = retry_after_seconds(err.headers.get("Retry-After"))
            if wait is None:
                # No time named (a proxy's 503, say): back off on our own.
                wait = min(2 ** attempt, 30)
            if deadline is not None and time.monotonic() + wait > deadline:
                raise APIError(err.code, problem) from None
            print(f"{method} {path}: {err.code} {problem.get('title', '')}; retrying in {wait:g}s",
                  file=sys.stderr)
            time.sleep(wait)
            attempt += 1


def main():
    p = argparse.ArgumentParser(description="Enqueue one call through shaper and print its result.")
    p.add_argument("--api", default=os.environ.get("SHAPER_API_URL", "http://localhost:8080"),
                   help="API base URL (default $SHAPER_API_URL or http://localhost:8080)")
    p.add_argument("--key", default=os.environ.get("SHAPER_API_KEY"), help="API key (default $SHAPER_API_KEY)")
    p.add_argument("--upstream", required=True)
    p.add_argument("--path", required=True, help="relative to the upstream's base URL")
    p.add_argument("--method", default=None)
    p.add_argument("--body", default=None, help="the call's body, as text")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")
    p.add_argument("--idempotency-key", default=None,
                   help="default: a random one, so that a retried enqueue cannot make a second job")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for the job, in all")
    args = p.parse_args()
    if not args.key:
        p.error("no API key: pass --key or set SHAPER_API_KEY")

    job = {"upstream": args.upstream, "path": args.path,
           "idempotency_key": args.idempotency_key or "example-" + uuid.uuid4().hex}
    if args.method:
        job["method"] = args.method
    if args.body is not None:
        job["body"] = args.body
    if args.header:
        job["headers"] = dict(h.split(":", 1) for h in args.header)
        job["headers"] = {k.strip(): v.strip() for k, v in job["headers"].items()}

    deadline = time.monotonic() + args.timeout
    try:
        status, accepted = call(args.api, args.key, "POST", "/v1/jobs", job, deadline)
        job_id = accepted["id"]
        print(f"enqueued {job_id} ({'new' if status == 202 else 'existing'})", file=sys.stderr)
        path = "/v1/jobs/" + urllib.parse.quote(job_id, safe="")
        got = accepted
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"job {job_id} still {got['state']} after {args.timeout:g}s", file=sys.stderr)
                return 2
            window = max(1, min(WAIT_WINDOW, int(left)))
            asked = time.monotonic()
            # The socket timeout leaves room for the answer after the wait.
            _, got = call(args.api, args.key, "GET", f"{path}?wait={window}s", deadline=deadline,
                          timeout=window + 10)
            if got["state"] in FINAL_STATES:
                break
            print(f"job {job_id} is {got['state']}; waiting", file=sys.stderr)
            if time.monotonic() - asked < window / 2:
                # Answered early (the server is shutting down): do not
                # turn that into a busy loop.
                time.sleep(1)
    except (APIError, urllib.error.URLError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    json.dump(got, sys.stdout, indent=2)
    print()
    return 0 if got["state"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
