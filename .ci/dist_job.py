#!/usr/bin/env python3
"""Runs the `hello` sample through a live wasmjob cluster's REST API, as an operator would.

Used by .ci/dist against each packaged form (tarball, Debian package, image, compose). With
several admins, the job is created through the first and one run is triggered through each;
every run must end in `success` with `hello, <param>` as its message. Exits non-zero, saying
why, otherwise. Every wait is bounded.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request


def call(base, token, method, path, body=None, content_type="application/json"):
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(base + "/api/v1" + path, data=data, method=method)
    request.add_header("Authorization", "Bearer " + token)
    if data is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def wait(what, probe, timeout):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except (OSError, ValueError) as error:  # not up yet
            last = error
        time.sleep(0.5)
    sys.exit(f"dist_job: timed out after {timeout} s waiting for {what} (last: {last!r})")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--admin", action="append", required=True, help="admin base URL")
    parser.add_argument("--token", required=True, help="the operator token")
    parser.add_argument("--wasm", required=True, help="hello.wasm")
    parser.add_argument("--app-name", default="default", help="the executors' group")
    parser.add_argument("--executors", type=int, default=1, help="executors to wait for")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    first = args.admin[0]

    for admin in args.admin:
        wait(f"{admin} to answer", lambda: call(admin, args.token, "GET", "/groups")[0] == 200, args.timeout)

    status, groups = call(first, args.token, "GET", "/groups")
    group = next((g for g in groups if g["app_name"] == args.app_name), None)
    if group is None:
        status, group = call(first, args.token, "POST", "/groups", {"app_name": args.app_name})
        if status != 201:
            sys.exit(f"dist_job: creating group {args.app_name}: {status} {group}")
    group_id = group["id"]

    def online():
        status, found = call(first, args.token, "GET", f"/groups/{group_id}")
        return status == 200 and len(found.get("online_addresses") or []) >= args.executors

    wait(f"{args.executors} executor(s) online in {args.app_name}", online, args.timeout)

    status, job = call(first, args.token, "POST", "/jobs", {
        "group_id": group_id, "name": "dist check", "schedule_type": "NONE", "timeout_secs": 60,
    })
    if status != 201:
        sys.exit(f"dist_job: creating the job: {status} {job}")
    with open(args.wasm, "rb") as component:
        status, version = call(first, args.token, "POST", f"/jobs/{job['id']}/versions?remark=dist",
                               component.read(), "application/wasm")
    if status not in (200, 201):
        sys.exit(f"dist_job: uploading {args.wasm}: {status} {version}")

    for index, admin in enumerate(args.admin):
        param = f"through admin {index + 1}"
        # A container network's names can fail to resolve for a moment while its containers
        # start: a run that no executor took because its address was unreachable is tried
        # again, a few times; any other outcome counts at once.
        for attempt in range(1, UNREACHABLE_ATTEMPTS + 1):
            run = run_once(admin, args.token, job["id"], param, args.timeout)
            unreachable = run.get("trigger_code") == 500 and "unreachable" in run.get("trigger_msg", "")
            if not unreachable or attempt == UNREACHABLE_ATTEMPTS:
                break
            print(f"dist_job: run {run['id']} found its executor unreachable; trying again")
            time.sleep(2)
        if run.get("state") != "success" or run.get("handle_msg") != f"hello, {param}":
            sys.exit(f"dist_job: run {run['id']} through {admin} did not succeed: {json.dumps(run)}")
        print(f"dist_job: run {run['id']} through {admin}: {run['state']}, {run['handle_msg']!r}")


UNREACHABLE_ATTEMPTS = 5


def run_once(admin, token, job_id, param, timeout):
    """Triggers the job once through `admin` and returns its run once it ended."""
    status, triggered = call(admin, token, "POST", f"/jobs/{job_id}/trigger", {"param": param})
    if status != 200:
        sys.exit(f"dist_job: triggering through {admin}: {status} {triggered}")
    log_id = triggered["log_ids"][0]

    def ended():
        status, run = call(admin, token, "GET", f"/logs/{log_id}")
        return run if status == 200 and run.get("handle_code") not in (0, None) else None

    return wait(f"run {log_id} to end", ended, timeout)


if __name__ == "__main__":
    main()
