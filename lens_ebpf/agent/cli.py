"""The node agent's command line: run, check, trace (and `lens-ebpf-agent`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from lens_ebpf import __version__
from lens_ebpf.agent import config
from lens_ebpf.core.commandline import CliError, parse_listen, run_command

log = logging.getLogger("lens_ebpf.agent")

EXAMPLES = """\
examples:
  lens-ebpf run                                  # agent on :9470, shipped policy
  lens-ebpf run --listen 127.0.0.1:9470 --policy /etc/lens/policy.yaml
  lens-ebpf run --config lens.yaml --no-collector.tcp
  lens-ebpf check                                # what this node supports, and why not
  lens-ebpf check --json                         # the same for tools
  lens-ebpf trace tcp --port 443                 # live flows, no agent needed (root)
"""


def collectors() -> list[str]:
    """collectors.<key> sections that can be switched off (--no-collector.<key>)."""
    from lens_ebpf.agent.feature import collector_settings

    return [k for k, m in collector_settings().items() if "enabled" in m.model_fields]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lens-ebpf",
        description="eBPF observability agent for Kubernetes GPU nodes",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the agent",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--config", help="YAML config file (also LENS_CONFIG)")
    run.add_argument("--policy", help="policy.yaml (default: the shipped policy)")
    run.add_argument("--listen", help="HOST:PORT for HTTP (default 0.0.0.0:9470)")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    run.add_argument(
        "--tuner",
        action="store_true",
        help="turn the system tuner on (collectors.tuner.enabled): it raises "
        "kernel settings that are lower than collectors.tuner asks",
    )
    for name in collectors():
        run.add_argument(
            f"--no-collector.{name}",
            dest=f"no_collector_{name}",
            action="store_true",
            help=f"disable the {name} collector",
        )
    from lens_ebpf.agent import trace

    trace.add_parser(sub)
    check = sub.add_parser("check", help="report what this kernel and node support")
    check.add_argument("--json", action="store_true", help="one JSON object")
    check.add_argument(
        "--config",
        help="YAML config file (also LENS_CONFIG): the tuner's "
        "settings to compare with this node's",
    )
    sub.add_parser("version", help="print the version")
    return parser


def _overrides(args: argparse.Namespace) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    if args.policy:
        out[("policy", "path")] = args.policy
    if args.listen:
        host, port = parse_listen(args.listen)
        out[("server", "host")] = host
        out[("server", "port")] = port
    if args.log_level:
        out[("log_level",)] = args.log_level
    if args.tuner:
        out[("collectors", "tuner", "enabled")] = True
    for name in collectors():
        if getattr(args, f"no_collector_{name}"):
            out[("collectors", name, "enabled")] = False
    return out


def run_agent(cfg: config.Config) -> int:
    """Run until SIGTERM or SIGINT; 0 on a clean stop."""
    from lens_ebpf.agent.service import Agent, StartupError

    agent = Agent(cfg)
    agent.install_signals()
    try:
        agent.start()
    except StartupError:
        agent.stop()
        raise
    if os.geteuid() != 0:
        log.warning("not running as root: BPF programs need CAP_BPF and CAP_PERFMON")
    agent.stop_event.wait()  # set by SIGTERM or SIGINT (install_signals)
    agent.stop()
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from lens_ebpf.agent.service import StartupError

    cfg = config.load(args.config, overrides=_overrides(args))
    logging.basicConfig(
        level=cfg.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return run_agent(cfg)
    except StartupError as exc:
        raise CliError(str(exc)) from None


def _cmd_check(args: argparse.Namespace) -> int:
    from lens_ebpf.agent import check

    result = check.run_checks(config.load(args.config))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(check.format_table(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(lambda: _command(args))


def _command(args: argparse.Namespace) -> int:
    if args.command == "version":
        print(f"lens-ebpf {__version__}")
        return 0
    if args.command == "check":
        return _cmd_check(args)
    if args.command == "trace":
        from lens_ebpf.agent import trace

        try:
            return trace.run(args)
        except trace.TraceError as exc:
            raise CliError(f"trace: {exc}") from None
    return _cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
