"""Faults a user's machine has (issue 34): full disks, odd output paths, closed streams, tiny widths, networks that
hang. The verdict and its exit code are never lost, and every output file is written atomically.

Streams, full disks and networks are tested with real processes: a saved plan is audited (``audit --plan``, torch
only), a small tmpfs is mounted in a user namespace (``unshare -rm``; skipped with the reason where that is not
allowed), and a local server accepts connections and never answers."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from kvaudit import network, outfile
from kvaudit.cli import main
from kvaudit.errors import UsageError
from conftest import ROOT


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory):
    """A plan of llama-3.1-8b saved once, audited by the real processes below with torch alone."""
    path = tmp_path_factory.mktemp("plan") / "llama.json"
    assert main(["plan", "llama-3.1-8b", "--save", str(path)]) == 0
    return path


def _kvaudit(*argv: str, shell_redirects: str = "", env: dict | None = None, timeout: float = 120):
    """``python -m kvaudit ARGV`` in a real process, with shell redirections (``>&-``) where given."""
    cmd = " ".join([sys.executable, "-m", "kvaudit", *(f"'{a}'" for a in argv)]) + " " + shell_redirects
    return subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# --- outputs: written atomically, checked before the work ------------------------------------------------------

def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    old = tmp_path / "report.html"
    old.write_text("the previous report")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        outfile.write(old, "x" * 100_000)
    assert old.read_text() == "the previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_a_write_replaces_the_file_keeps_its_mode_and_follows_a_link(tmp_path):
    real = tmp_path / "real.html"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.html"
    link.symlink_to(real)
    assert outfile.write(link, "new") == real
    assert link.is_symlink() and real.read_text() == "new" and (real.stat().st_mode & 0o777) == 0o640
    fresh = tmp_path / "fresh.html"
    umask = os.umask(0o022)
    try:
        outfile.write(fresh, "a")
    finally:
        os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o644  # as open() makes it, not mkstemp's 0600


@pytest.mark.parametrize("case", ["dangling link", "/proc", "full disk", "folder"])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path, monkeypatch, case):
    if case == "dangling link":
        path = tmp_path / "r.html"
        path.symlink_to(tmp_path / "missing" / "r.html")
        want = "folder"
    elif case == "/proc":
        path, want = "/proc/kvaudit-report.html", "cannot write"
    elif case == "full disk":
        path, want = tmp_path / "r.html", "No space left"
        monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0))
    else:
        path, want = tmp_path, "directory"
    with pytest.raises(UsageError, match=want):
        outfile.check(path)


def test_dev_full_keeps_the_verdict_and_its_exit_code_and_names_the_output(saved_plan):
    p = _kvaudit("audit", "--plan", str(saved_plan), "--meter", "meta", "--html", "/dev/full")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 0, p.stderr
    assert any(line.startswith("kvaudit: could not write /dev/full: No space left") for line in lines), p.stderr
    assert lines[-1].startswith("kvaudit: PASS") and "Traceback" not in p.stderr, p.stderr
    assert "kvaudit" in p.stdout  # the report itself


def test_a_full_disk_keeps_the_previous_page_whole_and_the_verdict(saved_plan, tmp_path):
    """A 64 KiB tmpfs: the probe's empty file fits, the ~80 KB page does not."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    cmd = (f"mount -t tmpfs -o size=64k tmpfs {mnt} && echo old > {mnt}/r.html && "
           f"{sys.executable} -m kvaudit audit --plan {saved_plan} --meter meta --html {mnt}/r.html >/dev/null; "
           f"echo rc=$?; cat {mnt}/r.html; ls -A {mnt}")
    p = subprocess.run(["unshare", "-rm", "bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if "rc=" not in p.stdout:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {p.stderr.strip()[:200]}")
    assert p.stdout.split() == ["rc=0", "old", "r.html"], (p.stdout, p.stderr)
    assert f"kvaudit: could not write {mnt}/r.html: No space left on device" in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("kvaudit: PASS"), p.stderr


# --- streams ---------------------------------------------------------------------------------------------------

def test_stdout_closed_keeps_the_verdict_on_stderr(saved_plan):
    p = _kvaudit("audit", "--plan", str(saved_plan), "--meter", "meta", shell_redirects=">&-")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("kvaudit: PASS"), p.stderr


def test_stderr_closed_keeps_the_whole_report_on_stdout(saved_plan):
    p = _kvaudit("audit", "--plan", str(saved_plan), "--meter", "meta", "--format", "json", shell_redirects="2>&-")
    assert p.returncode == 0, p.stdout[-500:]
    import json

    assert json.loads(p.stdout)["exit_code"] == 0


def test_triage_of_stdin_closed_is_one_line_and_exit_2():
    p = _kvaudit("triage", "-", shell_redirects="<&-")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith("kvaudit: error: stdin is empty"), p.stderr


@pytest.mark.parametrize("columns", ["0", "1", "7"])
def test_a_tiny_width_is_drawn_at_the_minimum(monkeypatch, capsys, columns):
    from kvaudit.cli import output

    monkeypatch.setenv("COLUMNS", columns)
    assert output.width() == output.MIN_WIDTH
    assert main(["llama-3.1-8b", "--meter", "meta", "--detail", "summary"]) == 0
    out = capsys.readouterr().out
    assert len(out) > 2000 and max(len(line) for line in out.splitlines()) <= output.MIN_WIDTH, out[:300]


# --- networks that hang ----------------------------------------------------------------------------------------

@pytest.fixture
def silent_server():
    """A server that accepts every connection and never answers; its URL."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def test_a_hub_that_never_answers_gives_up_in_the_timeout_with_exit_3(silent_server, tmp_path):
    start = time.monotonic()
    p = _kvaudit("someorg/somemodel", "--meter", "meta", timeout=60,
                 env={"HF_ENDPOINT": silent_server, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0",
                      network.ENV: "1"})
    assert p.returncode == 3, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith("kvaudit: fetching someorg/somemodel's config from the Hub") and "timeout 1 s" in lines[0]
    assert "did not answer within 1 s (KVAUDIT_NETWORK_TIMEOUT)" in lines[-1] and len(lines) == 2, p.stderr
    assert time.monotonic() - start < 45


def test_a_package_index_that_never_answers_falls_back_to_the_cache(silent_server, monkeypatch, tmp_path):
    from kvaudit.ci import history

    (tmp_path / "kvaudit" / "sdists" / "vllm-ascend-0.11.0").mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", silent_server + "/simple")
    monkeypatch.setenv(network.ENV, "1")
    start = time.monotonic()
    versions, source = history.published()
    assert versions == ["0.11.0"] and source.startswith("kvaudit's cache"), source
    assert time.monotonic() - start < 30  # pip's defaults: 109 s


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_a_bad_network_timeout_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv(network.ENV, value)
    with pytest.raises(UsageError, match=network.ENV):
        network.timeout_s()


# --- signals ---------------------------------------------------------------------------------------------------

def test_sigterm_ends_like_ctrl_c_and_leaves_no_temporary_folder(tmp_path):
    """``kill``, a CI job's timeout, ``docker stop``: exit 130, one line, and the gloo store kvaudit makes in TMPDIR
    while it builds the model is removed (SIGTERM's default ending skipped every clean-up)."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "kvaudit", "qwen3-next", "--meter", "meta"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 90
    while not list(tmp_path.glob("kvaudit-dist-*")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob("kvaudit-dist-*")), "the model was never built"
    p.send_signal(signal.SIGTERM)
    err = p.stderr.read()
    assert p.wait(timeout=60) == 130, err
    assert err.strip().splitlines()[-1] == "kvaudit: interrupted" and "Traceback" not in err, err
    assert not list(tmp_path.glob("kvaudit-*")), list(tmp_path.iterdir())  # (torch's inductor cache may stay)
