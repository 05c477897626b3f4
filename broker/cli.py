"""The ``plugbroker`` command (also ``python -m plugbroker``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("broker")


def _setup_logging(level: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        from plugbroker.logjson import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        from plugbroker.logsafe import TextFormatter

        handler.setFormatter(TextFormatter())
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])


def cmd_run(args: argparse.Namespace) -> int:
    # Until the broker has started (store recovered, listeners open) a signal only leaves a
    # note: SIGHUP's default action would end the process (exit 129) while the modules load or
    # the store is being recovered, and a reload then would race the start. :func:`main` sets
    # the notes up before anything slow runs (``args.early_signals``); the loop's handlers are
    # installed once the start is complete, and what was noted meanwhile is acted on right
    # then, by this list, in the order of the code (no loop iterations counted).
    noted = getattr(args, "early_signals", None)
    early, previous = noted if noted is not None else _early_signals()
    try:
        return _run(args, early)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(args: argparse.Namespace, early: list[int]) -> int:
    import asyncio

    from plugbroker.config import ConfigError, default_config_path
    from plugbroker.heap import freeze_start_heap, watch_collector
    from plugbroker.registry import PluginError
    from plugbroker.runner import LoopError, loop_factory, start_broker, uses_tls

    path = Path(args.config) if args.config else default_config_path()
    try:
        factory, loop_name = loop_factory(args.loop, tls=uses_tls(path))
    except LoopError as exc:
        print(f"plugbroker: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        from plugbroker.compiled import describe
        from plugbroker.server import install_signal_handlers

        log.info("event loop: %s", loop_name)
        log.info("hot path: %s", describe())
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        try:
            running = await start_broker(
                path, host=args.host, port=args.port, accept_store_loss=args.accept_store_loss
            )
        except ConfigError as exc:
            for problem in exc.all():
                print(f"plugbroker: {problem}", file=sys.stderr)
            return 2
        except PluginError as exc:
            print(f"plugbroker: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"plugbroker: cannot listen: {exc}", file=sys.stderr)
            return 1
        # started: from here the loop takes the signals; a signal noted before this line is
        # in ``early`` (no await between the install and the read: none is lost or run twice)
        install_signal_handlers(loop, stop.set, running.reload)
        for sig in early:
            if sig == signal.SIGHUP:
                log.warning("SIGHUP while starting: ignored (the configuration was just read)")
            else:
                log.warning(
                    "%s while starting: stopping now it has started", signal.Signals(sig).name
                )
                stop.set()
        early.clear()
        # what the start built is put out of the cycle collector's reach, and its pauses
        # are timed for /metrics (plugbroker.heap explains why)
        log.debug("%d objects from the start frozen (gc.freeze)", freeze_start_heap())
        watch_collector()
        where = f"{running.server.host}:{running.port}"
        if running.tls_port is not None and running.server.plain:
            where += f", amqps on port {running.tls_port}"
        elif running.tls_port is not None:
            where += " (amqps only)"
        if getattr(args, "log_format", "text") == "json":  # every line a JSON object
            log.info("plugbroker listening on %s (config %s)", where, path)
        else:
            print(f"plugbroker listening on {where} (config {path})", flush=True)
        await stop.wait()
        log.info("shutting down")
        await running.stop()
        log.info("stopped")
        return 0

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


def _early_signals() -> tuple[list[int], dict[int, Any]]:
    """Start noting SIGHUP, SIGTERM and SIGINT: the list they are noted in, and the handlers
    they had."""
    early: list[int] = []
    return early, _note_signals(early)


def _runs_the_broker(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for ``plugbroker run`` (its first positional word, past the
    top-level options and their values)."""
    takes_value = {"--log-level", "--log-format"}
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in takes_value:
            skip = True
        elif not word.startswith("-"):
            return word == "run"
    return False


def _note_signals(early: list[int]) -> dict[int, Any]:
    """Record SIGHUP, SIGTERM and SIGINT in ``early`` instead of acting on them; returns the
    handlers they had."""

    def note(sig: int, _frame: Any) -> None:
        early.append(sig)

    previous: dict[int, Any] = {}
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, note)
    return previous


def cmd_hash_password(args: argparse.Namespace) -> int:
    """Print a ``passwordHash`` for ``<user>``: RabbitMQ's format (``rabbitmqctl
    hash_password`` prints the same kind of value), from the argument or the first line of
    standard input."""
    from plugbroker.config.users import hash_password

    password = args.password
    if password is None:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password[:-1] if password.endswith("\r") else password
    if not password:
        print("plugbroker: hash-password: the password is empty", file=sys.stderr)
        return 2
    print(hash_password(password, args.algorithm))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from plugbroker.config import ConfigError, load_config
    from plugbroker.registry import PluginError
    from plugbroker.runner import load_plugins

    path = Path(args.file)
    try:
        plugins, registry = load_plugins(path)
        cfg = load_config(path, registry=registry)
        if plugins.configure is not None:
            plugins.configure(config=cfg)
        plugins.verify_policies(cfg)
    except ConfigError as exc:
        problems = exc.all()
        for problem in problems:  # every schema error, each with file, line and element
            print(f"plugbroker: {problem}", file=sys.stderr)
        if len(problems) > 1:
            print(f"plugbroker: {len(problems)} errors in {path}", file=sys.stderr)
        return 2
    except PluginError as exc:
        print(f"plugbroker: {exc}", file=sys.stderr)
        return 2
    print(cfg.describe())
    return 0


ADMIN_GETS = {
    "overview": "/api/overview",
    "queues": "/api/queues",
    "consumers": "/api/consumers",
    "blocklist": "/api/blocklist",
    "connections": "/api/connections",
    "dead-letters": "/api/dead-letters",
    "policy-actions": "/api/policy-actions",
    "config": "/api/config",
    "metrics": "/metrics",
}
#: actions on one queue: (method, path suffix)
ADMIN_QUEUE_ACTIONS = {
    "messages": ("GET", "messages"),
    "redrive": ("POST", "redrive"),
    "purge": ("POST", "purge"),
    "delete": ("POST", "delete"),
}
ADMIN_CONSUMER_ACTIONS = ("cancel", "release")

#: the columns of each listing: (heading, field)
COLUMNS: dict[str, list[tuple[str, str]]] = {
    "queues": [
        ("vhost", "vhost"),
        ("name", "name"),
        ("messages", "messages"),
        ("ready", "ready"),
        ("unacked", "unacked"),
        ("consumers", "consumers"),
        ("oldest (s)", "oldest_age_s"),
        ("policy", "policy"),
    ],
    "consumers": [
        ("vhost", "vhost"),
        ("queue", "queue"),
        ("tag", "tag"),
        ("connection", "connection"),
        ("ch", "channel"),
        ("unacked", "unacked"),
        ("prefetch", "prefetch"),
        ("isolated", "isolated"),
        ("timed out (s)", "timed_out_age_s"),
        ("last ack (s)", "last_ack_age_s"),
    ],
    "connections": [
        ("id", "id"),
        ("peer", "peer"),
        ("user", "user"),
        ("vhost", "vhost"),
        ("channels", "channels"),
        ("heartbeat", "heartbeat"),
        ("blocked", "blocked"),
    ],
    "dead-letters": [
        ("vhost", "vhost"),
        ("queue", "queue"),
        ("messages", "messages"),
        ("by reason", "by_reason"),
        ("from", "sources"),
        ("arrived since start", "received_by_reason"),
    ],
    "messages": [
        ("id", "id"),
        ("exchange", "exchange"),
        ("routing key", "routing_key"),
        ("size", "size"),
        ("deliveries", "delivery_count"),
        ("redelivered", "redelivered"),
    ],
    "policy-actions": [
        ("time", "time"),
        ("vhost", "vhost"),
        ("queue", "queue"),
        ("policy", "policy"),
        ("action", "action"),
        ("outcome", "outcome"),
        ("reason", "reason"),
    ],
}
COLUMNS["blocklist"] = COLUMNS["consumers"]


def _cell(field: str, v: object) -> str:
    """One table cell: dicts as ``k=v`` pairs, absent values as ``-``."""
    import time

    if v is None or v == {} or v == []:
        return "-"
    if field == "time" and isinstance(v, (int, float)):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v))
    if field == "policy" and isinstance(v, dict):
        return ", ".join(sorted(v))
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items())
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    return str(v)


def format_table(rows: list[dict[str, object]], columns: list[tuple[str, str]]) -> str:
    """Rows as a table with aligned columns (numbers right-aligned), one line per row."""
    cells = [[_cell(f, r.get(f)) for _, f in columns] for r in rows]
    heads = [h for h, _ in columns]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(heads)]
    numeric = [
        all(isinstance(r.get(f), (int, float)) and not isinstance(r.get(f), bool) for r in rows)
        and f != "time"
        and bool(rows)
        for _, f in columns
    ]

    def line(values: list[str]) -> str:
        out = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(out).rstrip()

    return "\n".join([line(heads), *(line(c) for c in cells)])


def format_answer(action: str, body: object) -> str:
    """What ``plugbroker admin ACTION`` prints without ``--json``."""
    if action in COLUMNS and isinstance(body, list):
        if not body:
            return f"(no {action.replace('-', ' ')})"
        return format_table(body, COLUMNS[action])
    if action == "config" and isinstance(body, dict):
        return f"{body.get('summary', '')}\n\n{body.get('xml') or ''}".rstrip()
    if isinstance(body, dict):
        pairs = [(k, _cell(k, v)) for k, v in body.items()]
        width = max((len(k) for k, _ in pairs), default=0)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in pairs)
    return str(body)


ADMIN_HINT = (
    "is the broker running with the admin interface on? It is the <admin> element of the "
    'configuration: <admin host="127.0.0.1" port="15672"/> under <broker> (config/default.xml '
    "has it); add it and restart the broker, or give --url the address it listens on"
)


def cmd_admin(args: argparse.Namespace) -> int:
    """Talk to a running broker's admin interface (``<admin>`` in its configuration)."""
    import base64
    import http.client
    import json
    import urllib.error
    import urllib.request
    from urllib.parse import quote, urlencode

    def q(v: str) -> str:
        return quote(v, safe="")

    params: list[tuple[str, str]] = []
    if args.action in ADMIN_GETS:
        method, path = "GET", ADMIN_GETS[args.action]
    elif args.action == "reload":
        method, path = "POST", "/api/reload"
    elif args.action in ADMIN_QUEUE_ACTIONS:
        if not args.queue:
            print(f"plugbroker admin {args.action}: name the queue", file=sys.stderr)
            return 2
        method, suffix = ADMIN_QUEUE_ACTIONS[args.action]
        path = f"/api/queues/{q(args.vhost)}/{q(args.queue)}/{suffix}"
        if args.action == "redrive":
            params = [("reason", r) for r in args.reason or ()]
            if args.limit is not None:
                params.append(("limit", str(args.limit)))
            if args.rate is not None:
                params.append(("rate", repr(args.rate)))
            if args.dry_run:
                params.append(("dry_run", "true"))
            if args.keep_counts:
                params.append(("reset", "false"))
    elif args.action == "close":
        if not args.queue:
            print(
                "plugbroker admin close: name the connection (its id, from "
                "`plugbroker admin connections`)",
                file=sys.stderr,
            )
            return 2
        method, path = "POST", f"/api/connections/{q(args.queue)}/close"
        if args.reason:
            params.append(("reason", args.reason[0]))
    elif args.action in ADMIN_CONSUMER_ACTIONS:
        if not args.queue or not args.tag:
            print(
                f"plugbroker admin {args.action}: name the queue and the consumer: "
                f"plugbroker admin {args.action} QUEUE --tag TAG [--connection ID]",
                file=sys.stderr,
            )
            return 2
        method = "POST"
        path = f"/api/consumers/{q(args.vhost)}/{q(args.queue)}/{q(args.tag)}/{args.action}"
        if args.connection:
            params.append(("connection", args.connection))
    else:  # pragma: no cover - argparse restricts the choices
        return 2
    if params:
        path += "?" + urlencode(params)
    url = args.url.rstrip("/")
    req = urllib.request.Request(url + path, method=method, data=b"" if method == "POST" else None)
    token = base64.b64encode(f"{args.user}:{args.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    context = None
    if args.cacert:  # https with a private CA (the broker's <admin><tls>)
        import ssl

        context = ssl.create_default_context(cafile=args.cacert)
    try:
        with urllib.request.urlopen(req, timeout=args.timeout, context=context) as resp:
            body = resp.read().decode()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        try:
            answer = json.loads(detail)
            text = str(answer.get("error", detail))
            if answer.get("reason"):
                text += f": {answer['reason']}"
        except (ValueError, AttributeError):
            text = detail.strip()
        print(f"plugbroker admin: {exc.code} {text}", file=sys.stderr)
        return 1
    except http.client.BadStatusLine as exc:
        if "AMQP" in str(exc):
            print(
                f"plugbroker admin: {url} is an AMQP port (it answered with the AMQP protocol "
                "header), not the admin interface; the admin interface listens on the port of "
                "<admin> in the broker's configuration (15672 by default): "
                "--url http://127.0.0.1:15672",
                file=sys.stderr,
            )
        else:
            print(f"plugbroker admin: {url} does not answer HTTP: {exc!r}", file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ConnectionRefusedError):
            print(
                f"plugbroker admin: cannot reach {url}: connection refused; {ADMIN_HINT}",
                file=sys.stderr,
            )
        else:
            print(f"plugbroker admin: cannot reach {url}: {reason}", file=sys.stderr)
        return 1
    except (OSError, http.client.HTTPException) as exc:
        print(f"plugbroker admin: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if args.action == "metrics":
        print(body, end="")
    elif args.json:
        print(json.dumps(json.loads(body), indent=2))
    else:
        print(format_answer(args.action, json.loads(body)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="plugbroker", description="AMQP 0-9-1 broker with pluggable consumer policies"
    )
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (default) or json: one JSON object per line (time, level, logger, message "
        "and the record's structured fields)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="start the broker")
    r.add_argument("--config", help="XML configuration (default: the shipped config/default.xml)")
    r.add_argument("--host", help="listen address (overrides <listen host>)")
    r.add_argument("--port", type=int, help="listen port (overrides <listen port>)")
    r.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=argparse.SUPPRESS,
        help="text (default) or json: one JSON object per log line, for log shippers",
    )
    r.add_argument(
        "--loop",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop: auto (default; uvloop when installed), asyncio or uvloop; "
        "also PLUGBROKER_LOOP",
    )
    r.add_argument(
        "--accept-store-loss",
        action="store_true",
        help="start even if the store's integrity checks find lost data (logged); "
        'as <store acceptLoss="true">, for one start',
    )
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("check-config", help="validate a configuration and show what applies where")
    c.add_argument("file")
    c.set_defaults(func=cmd_check_config)
    h = sub.add_parser(
        "hash-password",
        help="print a passwordHash for <user> (RabbitMQ's format); reads stdin without PASSWORD",
    )
    h.add_argument("password", nargs="?", help="the password (default: a line of stdin)")
    h.add_argument("--algorithm", choices=["sha256", "sha512"], default="sha256")
    h.set_defaults(func=cmd_hash_password)
    a = sub.add_parser("admin", help="query or steer a running broker (its <admin> interface)")
    a.add_argument(
        "action",
        choices=[*ADMIN_GETS, "reload", *ADMIN_QUEUE_ACTIONS, "close", *ADMIN_CONSUMER_ACTIONS],
    )
    a.add_argument(
        "queue",
        nargs="?",
        help="the queue (messages, redrive, purge, delete, cancel, release) or the connection "
        "(close)",
    )
    a.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    a.add_argument("--tag", help="cancel, release: the consumer tag")
    a.add_argument("--connection", help="cancel, release: the consumer's connection id")
    a.add_argument("--vhost", default="/")
    a.add_argument("--url", default="http://127.0.0.1:15672")
    a.add_argument("--user", default="guest")
    a.add_argument("--password", default="guest")
    a.add_argument("--timeout", type=float, default=10.0)
    a.add_argument(
        "--reason",
        action="append",
        help="redrive: only dead letters whose last death reason is this (repeatable): "
        "rejected, expired, maxlen, delivery_limit; close: the text the client gets",
    )
    a.add_argument("--limit", type=int, help="redrive: move at most this many")
    a.add_argument("--rate", type=float, help="redrive: messages per second, paced by the broker")
    a.add_argument(
        "--dry-run", action="store_true", help="redrive: only show what would move where"
    )
    a.add_argument(
        "--keep-counts",
        action="store_true",
        help="redrive: keep RECONSUMETIMES and the delivery count (default: start again)",
    )
    a.add_argument(
        "--cacert", help="PEM file of the CA that signed the admin server's certificate (https)"
    )
    a.set_defaults(func=cmd_admin)
    from plugbroker.analyze.cli import add_subparsers as add_analyze

    add_analyze(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # before the parser and the broker's modules load: a SIGHUP in the first moments of a
    # start only leaves a note (see cmd_run)
    noted = _early_signals() if _runs_the_broker(words) else None
    args = build_parser().parse_args(words)
    args.early_signals = noted
    _setup_logging(args.log_level, args.log_format)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
