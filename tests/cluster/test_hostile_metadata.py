"""Notice watchers against metadata servers that answer badly, on 127.0.0.1 only: malformed
answers, an ETag that is no URL text, answers trickled a byte at a time, and a notice dated
in year 9999. Each is logged and passed over, every request ends within its deadline, and a
valid notice served afterwards is heard."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from fake_metadata import FakeAwsMetadataForTests, FakeAzureMetadataForTests, FakeGcpMetadataForTests
from live_cluster import closed_url

from rlboost.cluster.notices.aws import AWS_NOTICE_S, AwsNotices
from rlboost.cluster.notices.azure import AZURE_NOTICE_S, AzureNotices
from rlboost.cluster.notices.base import NoticeConfig
from rlboost.cluster.notices.factory import detect
from rlboost.cluster.notices.gcp import GcpNotices


def _config(**urls) -> NoticeConfig:
    closed = closed_url()
    return NoticeConfig(**{"aws_url": closed, "gcp_url": closed, "azure_url": closed, "poll_s": 0.05,
                           "probe_timeout_s": 0.5, **urls})


def _in_thread(call, timeout_s: float = 60.0):
    """call() in a thread; its result, or AssertionError when it is still blocked after timeout_s."""
    got: list = []
    errors: list = []

    def run():
        try:
            got.append(call())
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"still blocked after {timeout_s} s"
    if errors:
        raise errors[0]
    return got[0]


class ScriptedAwsMetadataForTests(FakeAwsMetadataForTests):
    """Answers instance-action with each of `bad` bodies in turn (200), then as the fake does."""

    def __init__(self, bad: list[str]):
        super().__init__()
        self.bad = list(bad)

    def answer(self, method, url, headers):
        if url.path.endswith("instance-action") and self.bad and headers.get("X-aws-ec2-metadata-token"):
            return 200, self.bad.pop(0), {}
        return super().answer(method, url, headers)


@pytest.mark.parametrize("body", [json.dumps({"action": "terminate", "time": "soon"}),
                                  json.dumps({"action": "terminate", "time": 1234567890}),
                                  json.dumps({"action": "terminate", "time": None}),
                                  json.dumps(["terminate"]), "\xff" * 50])
def test_a_malformed_aws_answer_is_logged_once_and_a_later_notice_is_heard(body, caplog):
    with ScriptedAwsMetadataForTests([body] * 5) as aws:
        watcher = AwsNotices(_config(aws_url=aws.url))
        with caplog.at_level(logging.WARNING):
            assert _in_thread(lambda: watcher.next(0.5)) is None
            aws.notify(60.0)
            notice = _in_thread(lambda: watcher.next(10.0))
    assert notice is not None and notice.source == "aws" and 50 < notice.grace_s <= 60
    assert len([r for r in caplog.records if "instance-action" in r.getMessage()]) == 1  # once, not per poll


class ScriptedAzureMetadataForTests(FakeAzureMetadataForTests):
    def __init__(self, bad: list[str]):
        super().__init__()
        self.bad = list(bad)

    def answer(self, method, url, headers):
        if url.path == "/metadata/scheduledevents" and self.bad:
            return 200, self.bad.pop(0), {}
        return super().answer(method, url, headers)


@pytest.mark.parametrize("body", [json.dumps({"Events": 5}), json.dumps({"Events": [5, "x"]}),
                                  json.dumps({"Events": [{"EventType": "Preempt", "Resources": 7}]}),
                                  json.dumps({"Events": [{"EventType": "Preempt", "Resources": [{"a": 1}],
                                                          "NotBefore": 12}]})])
def test_a_malformed_azure_answer_is_passed_over_and_a_later_notice_is_heard(body):
    with ScriptedAzureMetadataForTests([body] * 5) as azure:
        watcher = AzureNotices(_config(azure_url=azure.url))
        first = _in_thread(lambda: watcher.next(0.5))
        assert first is None or first.source == "azure"  # a Preempt whose fields are odd may still count
        azure.notify(40.0)
        notice = _in_thread(lambda: watcher.next(10.0))
    assert notice is not None and notice.source == "azure"


class SpacedEtagGcpMetadataForTests(FakeGcpMetadataForTests):
    def _value(self):
        return ("TRUE", "etag 1/&x=") if self.noticed_at is not None else ("FALSE", "etag 0/&x=")


def test_a_gcp_etag_that_is_no_url_text_is_escaped_and_the_notice_is_heard():
    with SpacedEtagGcpMetadataForTests() as gcp:
        watcher = GcpNotices(_config(gcp_url=gcp.url))
        assert _in_thread(lambda: watcher.next(0.5)) is None
        got = []
        waiting = threading.Thread(target=lambda: got.append(watcher.next(30.0)), daemon=True)
        waiting.start()
        while not any("wait_for_change=true" in r[1] for r in gcp.requests):
            waiting.join(0.01)
        gcp.notify(0.0)
        waiting.join(60)
    assert got and got[0] is not None and got[0].source == "gcp"
    assert any("last_etag=etag%200%2F%26x%3D" in r[1] for r in gcp.requests)


class TricklingAwsMetadataForTests(FakeAwsMetadataForTests):
    """While `trickle` is set, every answer comes a byte at a time, 0.2 s apart (headers, or
    with where="body" the body of a long answer), for as long as the client waits."""

    def __init__(self, where: str):
        super().__init__()
        self.where, self.trickle = where, threading.Event()
        self.trickle.set()
        self.closing = threading.Event()

    def _handle(self, req, method):
        if not self.trickle.is_set():
            return super()._handle(req, method)
        head = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10000 + b"\r\nContent-Length: 100000\r\n\r\n"
        if self.where == "body":
            req.wfile.write(head)
            head = b"x" * 100000
        for byte in head:
            if self.closing.wait(0.2):
                return
            try:
                req.wfile.write(bytes([byte]))
                req.wfile.flush()
            except OSError:
                return

    def __exit__(self, *exc):
        self.closing.set()
        super().__exit__(*exc)


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_trickling_endpoint_cannot_hold_a_watcher_past_its_deadline(where):
    with TricklingAwsMetadataForTests(where) as aws:
        watcher = AwsNotices(_config(aws_url=aws.url, poll_s=0.5))
        assert _in_thread(lambda: watcher.next(0.5), timeout_s=30) is None  # the trickle lasts hours
        aws.trickle.clear()
        aws.notify(60.0)
        notice = _in_thread(lambda: watcher.next(20.0), timeout_s=60)
    assert notice is not None and notice.source == "aws"


def test_auto_probing_a_trickling_endpoint_ends_within_its_probe_timeout():
    with TricklingAwsMetadataForTests("headers") as slow, FakeGcpMetadataForTests() as gcp:
        t0 = time.monotonic()
        assert _in_thread(lambda: detect(_config(aws_url=slow.url, azure_url=slow.url)), timeout_s=30) == "none"
        assert _in_thread(lambda: detect(_config(aws_url=slow.url, gcp_url=gcp.url)), timeout_s=30) == "gcp"
        print(f"two probes against a trickling endpoint: {time.monotonic() - t0:.1f} s")  # a figure, not a test


def test_a_notice_dated_in_year_9999_is_clamped_to_the_cloud_s_notice_length():
    with ScriptedAwsMetadataForTests([json.dumps({"action": "terminate", "time": "9999-12-31T23:59:59Z"})]) as aws:
        notice = _in_thread(lambda: AwsNotices(_config(aws_url=aws.url)).next(5.0))
    assert notice is not None and 0 < notice.grace_s <= AWS_NOTICE_S
    far = json.dumps({"Events": [{"EventId": "e", "EventType": "Preempt", "Resources": ["spot-vm-3"],
                                  "NotBefore": "Fri, 31 Dec 9999 23:59:59 GMT"}]})
    with ScriptedAzureMetadataForTests([far]) as azure:
        notice = _in_thread(lambda: AzureNotices(_config(azure_url=azure.url)).next(5.0))
    assert notice is not None and 0 < notice.grace_s <= AZURE_NOTICE_S
