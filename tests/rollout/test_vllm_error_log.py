"""ErrorLog: vLLM's processes log their errors to a file as well, and the adapter reads the
cause back in one line, past vLLM's "See root cause above" wrappers. Checked here with a
process that configures its logging from the file's config the way vLLM's do (dictConfig of
VLLM_LOGGING_CONFIG_PATH), without vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from rlboost.rollout.vllm.logs import ErrorLog, cause_in

BASE = {"version": 1, "disable_existing_loggers": False,
        "formatters": {"vllm": {"format": "(%(processName)s) %(levelname)s %(message)s"}},
        "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "INFO",
                              "stream": "ext://sys.stdout"}},
        "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False}}}

FAILING_START = textwrap.dedent("""
    import json, logging, logging.config, os
    logging.config.dictConfig(json.load(open(os.environ["VLLM_LOGGING_CONFIG_PATH"])))
    log = logging.getLogger("vllm.v1.engine.core")
    log.info("Initializing a V1 LLM engine")
    try:
        try:
            raise ValueError("Available memory on node 0 (1.0/2.0 GiB) is less than requested for kv")
        except ValueError as e:
            raise RuntimeError("Engine core initialization failed. See root cause above.") from e
    except RuntimeError:
        log.exception("EngineCore failed to start.")
""")


def test_a_child_process_error_is_read_back_as_its_root_cause():
    log = ErrorLog(BASE)
    try:
        config = json.loads(log.config_path.read_text())
        assert config["handlers"]["vllm"] == BASE["handlers"]["vllm"]  # vLLM's own output stays
        out = subprocess.run([sys.executable, "-c", FAILING_START], env=log.env(), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "Initializing a V1 LLM engine" in out.stdout
        assert log.last_error() == "ValueError: Available memory on node 0 (1.0/2.0 GiB) is less than requested for kv"
    finally:
        log.close()
    assert not log.dir.exists()


def test_the_newest_record_is_read_and_a_record_without_traceback_gives_its_message():
    text = ("ERROR first failure\nTraceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'x'\n"
            "ERROR Worker died unexpectedly\n")
    assert cause_in(text) == "Worker died unexpectedly"
    assert cause_in("") == ""
