"""``plugbroker analyze report|backtest|recommend``: the command-line face of the pipeline.

:func:`add_subparsers` is all ``broker/cli.py`` calls; everything else lives here, so the core's
CLI does not import Spark (only running one of these commands does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from plugbroker.config.units import parse_duration


def add_subparsers(sub: Any) -> None:
    """Add ``analyze`` and its three commands to the ``plugbroker`` subparsers ``sub``."""
    a = sub.add_parser(
        "analyze",
        help="the Spark pipeline over the event journal (report, backtest, recommend)",
        description="Read the event journal (<journal path>) with PySpark. Local mode (local[*]) "
        "unless --master, spark-submit --master or the MASTER variable says otherwise.",
    )
    cmds = a.add_subparsers(dest="analyze_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--journal", required=True, help="the journal directory (<journal path>)")
        p.add_argument("--master", help="Spark master URL (default: local[*] or spark-submit's)")
        p.add_argument(
            "--conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a Spark setting, e.g. spark.driver.memory=4g (repeatable)",
        )
        p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
        p.add_argument(
            "--scratch",
            help="directory for intermediate results, shared by all "
            "executors on a cluster (default: a temporary one in local mode)",
        )

    r = cmds.add_parser(
        "report", help="per-queue and per-consumer figures, tables and an HTML page with plots"
    )
    common(r)
    r.add_argument("--out", required=True, help="output directory (report.html, tables/, csv/)")
    r.add_argument("--top", type=int, default=12, help="queues plotted on the page (default 12)")
    r.set_defaults(func=cmd_report)

    b = cmds.add_parser(
        "backtest",
        help="what a candidate config's policy jobs (built-in and its plugins') "
        "would have done to the recorded traffic",
    )
    common(b)
    b.add_argument("--config", required=True, help="the candidate XML configuration")
    b.add_argument("--out", help="also write the actions as tables and text here")
    b.add_argument(
        "--every",
        type=parse_duration,
        help="check period for every policy job "
        "(e.g. 1s), instead of the periods the candidate configures",
    )
    b.add_argument(
        "--fail-on-action",
        action="store_true",
        help="exit 3 when the candidate "
        "would have disconnected, deleted or isolated anything (for CI)",
    )
    b.set_defaults(func=cmd_backtest)

    c = cmds.add_parser(
        "recommend",
        help="ackTimeout and backlog thresholds from the journal, as a <queue>/<topic> XML snippet",
    )
    common(c)
    c.add_argument(
        "--headroom",
        type=float,
        default=2.0,
        help="backlog thresholds at this many times the largest seen (default 2)",
    )
    c.add_argument(
        "--ack-factor",
        type=float,
        default=10.0,
        help="ackTimeout at this many times the p99.9 processing time (default 10)",
    )
    c.add_argument(
        "--min-ack-timeout",
        type=parse_duration,
        default=300.0,
        help="lowest ackTimeout to propose (default 5m, as the TDMQ design advises)",
    )
    c.add_argument("--policy", default="Log", help="<policy name> to propose (default Log)")
    c.add_argument(
        "--no-backtest",
        action="store_true",
        help="do not backtest the proposal over the same journal (faster; the comment says so)",
    )
    c.add_argument(
        "--every",
        type=parse_duration,
        help="check period of that backtest (default: about 1/240 of the journal, 0.25s to 5s)",
    )
    c.set_defaults(func=cmd_recommend)


def _spark(args: argparse.Namespace) -> Any:
    import logging

    from plugbroker.analyze.spark import get_spark

    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("plugbroker.pluginhost").setLevel(logging.WARNING)  # plugin loading lines
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"plugbroker analyze: --conf wants KEY=VALUE, not {item!r}")
        conf[key.strip()] = value.strip()
    return get_spark(args.master, conf)


def _run(fn: Any, *, journal: str, config: str | None = None) -> int:
    """Check the inputs and Java before Spark starts (one line and an exit code each, see
    :mod:`plugbroker.analyze.preflight`), then run ``fn``."""
    from plugbroker.analyze.events import JournalError, check_local_journal
    from plugbroker.analyze.preflight import (
        EXIT_ENVIRONMENT,
        EXIT_INPUT,
        EnvironmentProblem,
        check_java,
    )
    from plugbroker.config import ConfigError
    from plugbroker.registry import PluginError

    try:
        check_local_journal(journal)
        if config is not None:
            from plugbroker.analyze.replay import load_candidate

            path = Path(config)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(
                    f"cannot read the candidate configuration: {exc.strerror or exc}",
                    file=str(path),
                ) from None
            load_candidate(text, str(path))
        check_java()
        return int(fn())
    except (JournalError, ConfigError, PluginError, FileNotFoundError) as exc:
        print(f"plugbroker analyze: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except EnvironmentProblem as exc:
        print(f"plugbroker analyze: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT


def cmd_report(args: argparse.Namespace) -> int:
    def go() -> int:
        from plugbroker.analyze.report import report

        result = report(
            args.journal,
            args.out,
            spark=_spark(args),
            top=args.top,
            quiet=args.quiet,
            scratch=args.scratch,
        )
        print(f"{result.html}")
        return 0

    return _run(go, journal=args.journal)


def cmd_backtest(args: argparse.Namespace) -> int:
    def go() -> int:
        from plugbroker.analyze.backtest import backtest

        result = backtest(
            args.journal,
            args.config,
            spark=_spark(args),
            every=args.every,
            out=args.out,
            quiet=args.quiet,
        )
        print(result.summary())
        return 3 if args.fail_on_action and result.disruptive() else 0

    return _run(go, journal=args.journal, config=args.config)


def cmd_recommend(args: argparse.Namespace) -> int:
    def go() -> int:
        from plugbroker.analyze.recommend import recommend

        result = recommend(
            args.journal,
            spark=_spark(args),
            headroom=args.headroom,
            ack_factor=args.ack_factor,
            min_ack_timeout=args.min_ack_timeout,
            policy=args.policy,
            quiet=args.quiet,
            scratch=args.scratch,
            check=not args.no_backtest,
            every=args.every,
        )
        print(result.xml, end="")
        return 0

    return _run(go, journal=args.journal)
