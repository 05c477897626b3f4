"""The ``plugbroker`` command (also ``python -m broker``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Sequence

log = logging.getLogger("broker")


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")


def cmd_run(args: argparse.Namespace) -> int:
    from broker.config import ConfigError, default_config_path
    from broker.registry import PluginError
    from broker.runner import start_broker

    path = Path(args.config) if args.config else default_config_path()

    async def main() -> int:
        try:
            running = await start_broker(path, host=args.host, port=args.port)
        except (ConfigError, PluginError) as exc:
            print(f"plugbroker: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"plugbroker: cannot listen: {exc}", file=sys.stderr)
            return 1
        from broker.server import install_signal_handlers

        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        install_signal_handlers(loop, stop.set, lambda: running.reload())
        print(f"plugbroker listening on {running.server.host}:{running.port} "
              f"(config {path})", flush=True)
        await stop.wait()
        log.info("shutting down")
        await running.stop()
        log.info("stopped")
        return 0

    return asyncio.run(main())


def cmd_check_config(args: argparse.Namespace) -> int:
    from broker.config import ConfigError, load_config
    from broker.registry import PluginError
    from broker.runner import load_plugins

    path = Path(args.file)
    try:
        plugins, registry = load_plugins(path)
        cfg = load_config(path, registry=registry)
        if plugins.configure is not None:
            plugins.configure(config=cfg)
        plugins.verify_policies(cfg)
    except (ConfigError, PluginError) as exc:
        print(f"plugbroker: {exc}", file=sys.stderr)
        return 2
    print(cfg.describe())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="plugbroker", description="AMQP 0-9-1 broker with "
                                "pluggable consumer policies")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="start the broker")
    r.add_argument("--config", help="XML configuration (default: the shipped config/default.xml)")
    r.add_argument("--host", help="listen address (overrides <listen host>)")
    r.add_argument("--port", type=int, help="listen port (overrides <listen port>)")
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("check-config", help="validate a configuration and show what applies where")
    c.add_argument("file")
    c.set_defaults(func=cmd_check_config)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
