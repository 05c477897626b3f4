"""The broker as a process: the README's run command, graceful SIGTERM, bad config refused."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import amqp
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(config: Path, port: int, cwd: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plugbroker",
            "run",
            "--config",
            str(config),
            "--port",
            str(port),
            *extra,
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read()) from None  # type: ignore[union-attr]
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("the broker did not start listening")


def default_config(tmp_path: Path) -> Path:
    """The shipped default configuration with its admin interface on a free port (15672 may
    be taken by another broker on this machine)."""
    text = (ROOT / "config" / "default.xml").read_text()
    assert 'port="15672"' in text
    path = tmp_path / "default.xml"
    path.write_text(text.replace('port="15672"', f'port="{free_port()}"'))
    return path


def test_default_config_sigterm_closes_clients_with_320_and_exits_cleanly(tmp_path):
    port = free_port()
    proc = start(default_config(tmp_path), port, tmp_path)
    try:
        conn = amqp.Connection(host=f"127.0.0.1:{port}", userid="guest", password="guest")
        conn.connect()
        ch = conn.channel()
        ch.queue_declare("survivor", durable=True, auto_delete=False)
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(amqp.exceptions.ConnectionForced) as err:
            for _ in range(50):
                conn.drain_events(timeout=0.1)
        assert err.value.reply_code == 320
        assert proc.wait(timeout=15) == 0
        out = proc.stdout.read()  # type: ignore[union-attr]
        assert "shutting down" in out and "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_run_on_the_loop_asked_for_logs_it_and_serves(tmp_path, loop):
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    port = free_port()
    proc = start(default_config(tmp_path), port, tmp_path, "--loop", loop)
    try:
        conn = amqp.Connection(host=f"127.0.0.1:{port}", userid="guest", password="guest")
        conn.connect()
        ch = conn.channel()
        ch.queue_declare("loop-q", auto_delete=False)
        acks: list[tuple[int, bool]] = []
        ch.events["basic_ack"].add(lambda tag, multiple: acks.append((tag, multiple)))
        ch.confirm_select()
        for i in range(200):
            ch.basic_publish(amqp.Message(f"m{i}"), "", "loop-q")
        deadline = time.monotonic() + 10
        while (not acks or acks[-1][0] < 200) and time.monotonic() < deadline:
            conn.drain_events(timeout=1)
        assert acks[-1][0] == 200
        got = []
        ch.basic_qos(0, 50, False)
        ch.basic_consume(
            "loop-q", callback=lambda m: (got.append(m.body), m.channel.basic_ack(m.delivery_tag))
        )
        while len(got) < 200 and time.monotonic() < deadline:
            conn.drain_events(timeout=1)
        assert got == [f"m{i}" for i in range(200)]
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        out = proc.stdout.read()  # type: ignore[union-attr]
        assert f"event loop: {loop}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_a_bad_config_is_refused_at_start_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text(
        '<broker>\n<virtualhost name="/">\n<topic key="a.*"><consumer>'
        "<maessageAge>5</maessageAge></consumer></topic>\n</virtualhost></broker>"
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "plugbroker",
            "run",
            "--config",
            str(bad),
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert f"{bad}:3" in res.stderr and "maessageAge" in res.stderr


def test_an_unknown_plugin_is_refused_at_start(tmp_path):
    cfg = tmp_path / "p.xml"
    cfg.write_text("<broker><plugins><plugin>no_such_plugin_module</plugin></plugins></broker>")
    res = subprocess.run(
        [sys.executable, "-m", "plugbroker", "check-config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2 and "no_such_plugin_module" in res.stderr
    assert "could not be imported" in res.stderr


def test_run_refuses_uvloop_with_a_tls_listener(tmp_path):
    cfg = tmp_path / "tls.xml"
    cfg.write_text('<broker><tls port="5671" cert="c.pem" key="k.pem"/></broker>')
    res = subprocess.run(
        [sys.executable, "-m", "plugbroker", "run", "--config", str(cfg), "--loop", "uvloop"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert "uvloop does not serve the TLS listeners" in res.stderr


def test_log_format_json_writes_one_object_per_line(tmp_path):
    port = free_port()
    proc = start(ROOT / "config" / "default.xml", port, tmp_path, "--log-format", "json")
    try:
        conn = amqp.Connection(host=f"127.0.0.1:{port}", userid="guest", password="guest")
        conn.connect()
        ch = conn.channel()
        with pytest.raises(amqp.exceptions.AMQPNotImplementedError):
            ch.basic_publish(amqp.Message("x"), routing_key="q", immediate=True)
            conn.drain_events(timeout=2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        out = proc.stdout.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    bad = [line for line in out.splitlines() if line.strip() and not line.startswith("{")]
    assert not bad, bad
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert lines
    for rec in lines:
        assert {"time", "level", "logger", "message"} <= rec.keys(), rec
    closed = [r for r in lines if "540" in r["message"]]
    assert (
        closed and closed[0]["level"] == "WARNING" and closed[0]["logger"] == "plugbroker.session"
    )
    assert any(r["message"].startswith("event loop:") for r in lines)


def test_run_freezes_the_start_and_times_the_cycle_collector_in_metrics(tmp_path):
    import base64
    import re
    import urllib.request

    config = default_config(tmp_path)
    admin_port = re.search(r'<admin [^>]*port="(\d+)"', config.read_text())
    assert admin_port is not None
    port = free_port()
    proc = start(config, port, tmp_path)
    try:
        conn = amqp.Connection(host=f"127.0.0.1:{port}", userid="guest", password="guest")
        conn.connect()
        ch = conn.channel()
        ch.queue_declare("gc-work")
        for i in range(2000):  # enough allocations for the collector to run
            ch.basic_publish(amqp.Message(b"x" * 64, application_headers={"i": i}), "", "gc-work")
        ch.queue_purge("gc-work")
        conn.close()
        req = urllib.request.Request(f"http://127.0.0.1:{admin_port.group(1)}/metrics")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(req, timeout=5) as resp:
            text = resp.read().decode()
        frozen = re.search(r"^plugbroker_gc_frozen_objects (\d+)$", text, re.M)
        assert frozen is not None and int(frozen.group(1)) > 1000  # the start, frozen
        assert re.search(r'^plugbroker_gc_collections_total\{generation="0"\} [1-9]', text, re.M)
        assert 'plugbroker_gc_pause_seconds_max{generation="2"}' in text  # watched: timed
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
