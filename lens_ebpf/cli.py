"""`lens-ebpf`: one command for both services. It imports neither until it knows which
the command is for, so the recorder's image needs none of the agent's libraries
(BCC, GPU bindings) and the agent's none of the recorder's (SQLAlchemy)."""

from __future__ import annotations

import sys

from lens_ebpf import __version__

AGENT = ("run", "check", "trace")
USAGE = f"""\
usage: lens-ebpf COMMAND [options]    (lens-ebpf COMMAND --help for its options)

the node agent (lens_ebpf.agent):
  run        run the agent on this node
  check      report what this kernel and node support, and why not
  trace      live flows, RTT, execs or GPU faults, without an agent (root)
the recorder (lens_ebpf.recorder):
  recorder   GPU pods and their workloads in a database, the agents' events, REST
either:
  collect    reference collector for the agents' event reporter
  version    print the version ({__version__})
"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    if command in AGENT:
        from lens_ebpf.agent import cli as agent_cli

        return agent_cli.main(args)
    if command == "recorder":
        from lens_ebpf.recorder import cli as cluster_cli

        return cluster_cli.main(args[1:], prog="lens-ebpf recorder")
    if command == "collect":
        from lens_ebpf.protocol import collector_server

        return collector_server.main(args[1:])
    if command == "version":
        print(f"lens-ebpf {__version__}")
        return 0
    if command in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    print(USAGE, end="", file=sys.stderr)
    print(
        f"lens-ebpf: error: {'unknown command ' + repr(command) if command else 'no command'}",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
