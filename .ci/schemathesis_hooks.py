"""Schemathesis hooks for .ci/schemathesis: a check that a refused change changed nothing.

Before every request that is not a GET, the hook takes a snapshot of what the operator API
shows (the audit log's size, jobs, groups, users, runs); after a 4xx answer to it, the check
`refused_request_changed_nothing` takes another and fails on any difference. Every change
through /api/v1 writes the audit log, so a refused request that changed something shows there
even where the lists below do not (a version upload, a kill). Snapshots are compared with one
worker only, so no other request can change things in between.

What the scheduler changes by itself (next fire times, online addresses) is left out.
"""

import json
import os
import urllib.request

import schemathesis
from schemathesis.transport.serialization import serialize_binary

URL = os.environ["WASMJOB_FUZZ_URL"].rstrip("/")
TOKEN = os.environ["WASMJOB_FUZZ_TOKEN"]

# Fields the admin changes without a request.
VOLATILE = {"next_fire_time", "online_addresses", "updated_at"}

_before = {}


def _get(path):
    request = urllib.request.Request(URL + path, headers={"Authorization": "Bearer " + TOKEN})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def _strip(value):
    if isinstance(value, dict):
        return {key: _strip(item) for key, item in value.items() if key not in VOLATILE}
    if isinstance(value, list):
        return [_strip(item) for item in value]
    return value


def snapshot():
    return {
        "audit entries": _get("/api/v1/audit?limit=1")["total"],
        "jobs": _strip(_get("/api/v1/jobs")),
        "groups": _strip(_get("/api/v1/groups")),
        "users": _get("/api/v1/users"),
        "runs": _get("/api/v1/logs?limit=1")["total"],
    }


def _changes_state(case):
    return case.method.upper() not in ("GET", "HEAD", "OPTIONS")


@schemathesis.hook
def before_call(context, case, kwargs):
    if _changes_state(case):
        _before[id(case)] = snapshot()


@schemathesis.check
def refused_request_changed_nothing(ctx, response, case):
    before = _before.pop(id(case), None)
    if before is None or not 400 <= response.status_code < 500:
        return None
    after = snapshot()
    changed = [key for key in before if before[key] != after[key]]
    if changed:
        raise AssertionError(
            f"{case.method} {case.path} was refused with {response.status_code} "
            f"but changed: {', '.join(changed)}"
        )
    return None


@schemathesis.serializer("application/wasm")
def wasm(ctx, value):
    """An upload's bytes go as they are, as schemathesis sends application/octet-stream."""
    return {"data": serialize_binary(value)}
