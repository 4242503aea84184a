"""`wait_healthy`, the one loop that waits for a server's /health (`launched_server`, `paged
launch`, the router benchmark and these tests' fixtures): a server that dies while starting is
reported at once with its exit code and log; one that never answers, at the timeout."""
import time

import pytest

from paged.serve.server_process import free_port, wait_healthy

from .conftest import Processes


def test_a_server_that_exits_is_reported_at_once_with_its_log(procs: Processes):
    proc = procs.start("dies", "-c", "import sys; print('no model here', flush=True); sys.exit(3)")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)the server exited with code 3 while starting.*no model here"):
        wait_healthy(f"http://127.0.0.1:{free_port()}", proc, 60, "the server", proc.log_path)
    assert time.monotonic() - start < 30  # not the 60 s timeout


def test_a_server_that_never_answers_times_out(procs: Processes):
    proc = procs.start("silent", "-c", "import time; time.sleep(60)")
    with pytest.raises(RuntimeError, match=r"silent at http://127\.0\.0\.1:\d+ did not answer /health .* within 1 s"):
        wait_healthy(f"http://127.0.0.1:{free_port()}", proc, 1.0, "silent")
    assert proc.poll() is None  # the caller's to stop (the fixture does)


def test_a_server_that_answers_is_waited_for(procs: Processes):
    port = free_port()
    proc = procs.start("fake", "-m", "tests.serve.fake_backend", "--port", str(port))
    wait_healthy(f"http://127.0.0.1:{port}", proc, 60)
    assert proc.poll() is None
