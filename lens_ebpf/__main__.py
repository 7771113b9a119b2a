from lens_ebpf.cli import main

raise SystemExit(main())
