"""python -m lens_ebpf.agent.native: build the compiled event path (_native.c)."""

import sys

from lens_ebpf.agent.native import main

if __name__ == "__main__":
    sys.exit(main())
