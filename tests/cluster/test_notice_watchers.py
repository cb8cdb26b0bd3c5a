"""Each cloud's notice watcher against a fake metadata server of that cloud on 127.0.0.1
(tests/fake_metadata.py), `auto` picking the cloud that answers, and the shutdown
hook's socket. No test here contacts a real metadata address: every base URL is a
loopback one."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
from fake_metadata import FakeAwsMetadataForTests, FakeAzureMetadataForTests, FakeGcpMetadataForTests
from live_cluster import closed_url, socket_folder

from rlboost.cluster.notices.aws import AwsNotices
from rlboost.cluster.notices.azure import AzureNotices
from rlboost.cluster.notices.base import NoticeConfig
from rlboost.cluster.notices.factory import build_watcher, detect
from rlboost.cluster.notices.gcp import GcpNotices
from rlboost.cluster.notices.hook import HookListener, pick_socket, send_notice, socket_path


def _config(**urls) -> NoticeConfig:
    closed = closed_url()
    return NoticeConfig(**{"aws_url": closed, "gcp_url": closed, "azure_url": closed, "poll_s": 0.05,
                           "probe_timeout_s": 2.0, **urls})


def test_aws_answers_404_until_the_notice_then_the_time_it_gives():
    with FakeAwsMetadataForTests() as aws:
        watcher = AwsNotices(_config(aws_url=aws.url))
        assert watcher.next(0.2) is None
        aws.notify(90.0)
        notice = watcher.next(5.0)
    assert notice.source == "aws" and notice.detail == "terminate"
    assert 80.0 < notice.grace_s <= 90.0  # the cloud's deadline, read to the second
    token_puts = [r for r in aws.requests if r[0] == "PUT" and r[1] == "/latest/api/token"]
    actions = [r for r in aws.requests if r[1] == "/latest/meta-data/spot/instance-action"]
    assert len(token_puts) == 1 and len(actions) >= 2  # IMDSv2: one session token, then questions with it
    assert all(h.get("x-aws-ec2-metadata-token") == "token-0" for _, _, h in actions)


def test_gcp_waits_for_the_value_to_change_and_sends_the_flavor_header():
    with FakeGcpMetadataForTests() as gcp:
        watcher = GcpNotices(_config(gcp_url=gcp.url, gcp_grace_s=25.0))
        assert watcher.next(0.5) is None  # reads FALSE and its ETag
        got = []
        waiting = threading.Thread(target=lambda: got.append(watcher.next(30.0)))
        waiting.start()
        while not any("wait_for_change=true" in r[1] for r in gcp.requests):
            waiting.join(0.01)
        gcp.notify(0.0)
        waiting.join(30)
    assert got and got[0].source == "gcp" and got[0].grace_s == 25.0  # GCP gives 30 s; configured here
    assert all(h.get("metadata-flavor") == "Google" for _, _, h in gcp.requests)
    waits = [r[1] for r in gcp.requests if "wait_for_change=true" in r[1]]
    assert waits and all("last_etag=etag-0" in path for path in waits)


def test_azure_takes_this_vm_s_preempt_event_with_its_not_before():
    with FakeAzureMetadataForTests(other_vm_first=True) as azure:
        watcher = AzureNotices(_config(azure_url=azure.url))
        assert watcher.next(0.2) is None
        azure.notify(45.0)
        notice = watcher.next(5.0)
    assert notice.source == "azure" and notice.detail == "602d9444"  # not the other VM's event
    assert 40.0 < notice.grace_s <= 45.0
    assert all(h.get("metadata") == "true" for _, _, h in azure.requests)


def test_auto_probes_each_cloud_once_and_takes_the_one_that_answers():
    with FakeGcpMetadataForTests() as gcp, FakeAzureMetadataForTests() as azure:
        assert detect(_config(gcp_url=gcp.url)) == "gcp"
        assert detect(_config(azure_url=azure.url)) == "azure"
        assert build_watcher("auto", _config(gcp_url=gcp.url)).name == "gcp"
        assert len([r for r in gcp.requests if r[1].endswith("/instance/id")]) == 2  # once per probe
    with FakeAwsMetadataForTests() as aws:
        assert detect(_config(aws_url=aws.url)) == "aws"
    assert detect(_config()) == "none"  # nothing answers: the node's shutdown hook only


def test_a_server_that_is_not_the_cloud_s_is_not_taken_for_it():
    with FakeAwsMetadataForTests() as other:  # answers 404 to GCP's paths, without GCP's header
        assert detect(_config(gcp_url=other.url, azure_url=other.url)) == "none"


def test_a_metadata_service_that_stops_answering_is_retried_not_fatal():
    watcher = AwsNotices(_config())  # nothing listens: every question fails
    assert watcher.next(0.2) is None
    with pytest.raises(ValueError, match="notice_source"):
        build_watcher("ibm", _config())


def _hook(tmp_path, taken: bool = True):
    folder = socket_folder(tmp_path / "notices")
    got = []

    def take(pending):
        got.append(pending)
        if taken:
            pending.taken.set()
            pending.drained.set()

    return HookListener(socket_path(folder, "ab" * 28), take), folder, got


def test_the_shutdown_hook_s_notice_reaches_the_listener_and_is_answered(tmp_path):
    listener, folder, got = _hook(tmp_path)
    try:
        assert oct(folder.stat().st_mode & 0o777) == "0o700"
        assert oct(listener.path.stat().st_mode & 0o777) == "0o600"
        path = pick_socket(folder, None)
        assert send_notice(path, 20.0, wait=True) == {"format_version": 1, "taken": True, "drained": True}
        assert got[0].notice.source == "hook" and got[0].notice.grace_s == 20.0
        with pytest.raises(ValueError, match="no rlboost run"):
            pick_socket(folder, "ffff")
    finally:
        listener.close()
    assert not listener.path.exists()
    with pytest.raises(ValueError, match="no rlboost run listens"):
        pick_socket(folder, None)


@pytest.mark.parametrize("line", [b"not json\n", b'{"format_version": 9, "grace_s": 5}\n',
                                  b'{"format_version": 1, "grace_s": -1}\n', b'{"format_version": 1}\n',
                                  b"x" * 9000])
def test_a_bad_request_gets_an_error_and_the_listener_keeps_serving(tmp_path, line):
    listener, folder, got = _hook(tmp_path)
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(10)
            conn.connect(str(listener.path))
            conn.sendall(line)
            answer = json.loads(conn.makefile("rb").readline())
        assert "error" in answer and not got
        assert send_notice(listener.path, 3.0)["taken"] is True  # the next one is served
    finally:
        listener.close()


def test_a_folder_others_may_write_is_refused(tmp_path):
    folder = socket_folder(tmp_path / "open")
    folder.mkdir(exist_ok=True)
    os.chmod(folder, 0o777)
    with pytest.raises(PermissionError, match="0700"):
        HookListener(socket_path(folder, "cd" * 28), lambda pending: None)
