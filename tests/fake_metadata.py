"""Fake cloud metadata servers for tests, on 127.0.0.1 only, speaking each cloud's protocol
as its documentation states it (the fakes say so in their names):

- AWS IMDSv2: PUT /latest/api/token (header X-aws-ec2-metadata-token-ttl-seconds) gives a
  token; GET /latest/meta-data/spot/instance-action needs it (401 without), answers 404
  until noticed, then {"action": "terminate", "time": "YYYY-MM-DDTHH:MM:SSZ"}.
- GCP: every request needs `Metadata-Flavor: Google` (403 without) and the answers carry
  it; /computeMetadata/v1/instance/preempted answers FALSE or TRUE with an ETag, and with
  ?wait_for_change=true&last_etag=E only once the value differs from E (or timeout_sec).
- Azure: every request needs `Metadata: true` (400 without); metadata/instance/compute/name
  names the VM; metadata/scheduledevents lists events, a Preempt with NotBefore once noticed.

Each records the requests it got (header names in lower case), so a test can tell which ones came.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class _FakeServerForTests:
    """A threaded HTTP server on 127.0.0.1 (port chosen by the system); notify(grace_s) starts the notice."""

    def __init__(self, host: str = "127.0.0.1"):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's names)
                fake._handle(self, "GET")

            def do_PUT(self):  # noqa: N802
                fake._handle(self, "PUT")

            def log_message(self, *args):
                pass

        self.requests: list[tuple[str, str, dict]] = []
        self.noticed_at: float | None = None
        self.grace_s = 0.0
        self.changed = threading.Condition()
        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def notify(self, grace_s: float) -> None:
        with self.changed:
            self.noticed_at, self.grace_s = time.time(), grace_s
            self.changed.notify_all()

    def reset(self) -> None:
        """No notice again (the next node of this cloud starts unnoticed)."""
        with self.changed:
            self.noticed_at = None
            self.changed.notify_all()

    def notify_all(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def _handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        self.requests.append((method, req.path, {k.lower(): v for k, v in req.headers.items()}))
        status, body, headers = self.answer(method, urlparse(req.path), req.headers)
        data = body.encode()
        req.send_response(status)
        for k, v in {"Content-Length": str(len(data)), **headers}.items():
            req.send_header(k, v)
        req.end_headers()
        req.wfile.write(data)

    def deadline(self) -> datetime:
        return datetime.fromtimestamp(self.noticed_at + self.grace_s, timezone.utc)

    def answer(self, method, url, headers) -> tuple[int, str, dict]:
        raise NotImplementedError


class FakeAwsMetadataForTests(_FakeServerForTests):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tokens: set[str] = set()

    def answer(self, method, url, headers):
        if url.path == "/latest/api/token":
            if method != "PUT" or not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, "", {}
            token = f"token-{len(self.tokens)}"
            self.tokens.add(token)
            return 200, token, {}
        if url.path == "/latest/meta-data/spot/instance-action":
            if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
                return 401, "", {}
            if self.noticed_at is None:
                return 404, "Not Found", {}
            when = self.deadline().strftime("%Y-%m-%dT%H:%M:%SZ")
            return 200, json.dumps({"action": "terminate", "time": when}), {"Content-Type": "text/plain"}
        return 404, "", {}


class FakeGcpMetadataForTests(_FakeServerForTests):
    def _value(self) -> tuple[str, str]:
        return ("TRUE", "etag-1") if self.noticed_at is not None else ("FALSE", "etag-0")

    def answer(self, method, url, headers):
        if headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header.", {}
        google = {"Metadata-Flavor": "Google"}
        if url.path == "/computeMetadata/v1/instance/id":
            return 200, "4520031799277581759", google
        if url.path != "/computeMetadata/v1/instance/preempted":
            return 404, "", google
        query = parse_qs(url.query)
        if query.get("wait_for_change") == ["true"]:
            last = query.get("last_etag", [""])[0]
            limit = time.monotonic() + float(query.get("timeout_sec", ["60"])[0])
            with self.changed:
                while self._value()[1] == last and time.monotonic() < limit:
                    self.changed.wait(max(0.0, limit - time.monotonic()))
        value, etag = self._value()
        return 200, value, {**google, "ETag": etag}


class FakeAzureMetadataForTests(_FakeServerForTests):
    vm = "spot-vm-3"

    def __init__(self, *args, other_vm_first: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.other_vm_first = other_vm_first

    def answer(self, method, url, headers):
        if headers.get("Metadata") != "true":
            return 400, json.dumps({"error": "Bad request. Required metadata header not specified"}), {}
        if url.path == "/metadata/instance/compute/name":
            return 200, self.vm, {}
        if url.path != "/metadata/scheduledevents":
            return 404, "", {}
        events = []
        if self.noticed_at is not None:
            not_before = format_datetime(self.deadline(), usegmt=True)
            if self.other_vm_first:  # a scale set's other VM is preempted too: not ours
                events.append({"EventId": "other", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                               "Resources": ["spot-vm-9"], "EventStatus": "Scheduled",
                               "NotBefore": format_datetime(datetime.now(timezone.utc) + timedelta(seconds=1),
                                                            usegmt=True)})
            events.append({"EventId": "602d9444", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                           "Resources": [self.vm], "EventStatus": "Scheduled", "NotBefore": not_before,
                           "Description": "", "EventSource": "Platform", "DurationInSeconds": -1})
        return 200, json.dumps({"DocumentIncarnation": len(events), "Events": events}), {}
