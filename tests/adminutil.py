"""Helpers of the admin's end-to-end tests: a request as guest, a bystander publishing with
confirms on its own connection while an admin command or listing runs."""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request

import amqp

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def request(port: int, method: str, path: str, headers: dict[str, str] | None = None):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, data=b"" if method == "POST" else None
    )
    req.add_header("Authorization", AUTH)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def connect(b, **kw) -> amqp.Connection:
    conn = amqp.Connection(
        host=f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5, **kw
    )
    conn.connect()
    return conn


class Bystander:
    """A client on its own connection that publishes with confirms while a command runs."""

    def __init__(self, b) -> None:
        self.conn = connect(b)
        self.ch = self.conn.channel()
        self.ch.queue_declare("bystander", auto_delete=False)
        self.ch.confirm_select()
        self.sent = 0

    def publish(self, n: int = 5) -> None:
        for _ in range(n):
            self.ch.basic_publish(amqp.Message(b"b"), "", "bystander")  # confirmed, or raises
            self.sent += 1

    def check(self) -> None:
        self.publish()
        assert self.ch.queue_declare("bystander", passive=True).message_count == self.sent
        self.conn.close()


class BusyBystander:
    """A bystander publishing with confirms in a thread of its own until stopped."""

    def __init__(self, b) -> None:
        self.by = Bystander(b)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for _ in range(1_000_000):
            if self.stop.is_set():
                return
            self.by.publish(1)

    def check(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.by.check()
