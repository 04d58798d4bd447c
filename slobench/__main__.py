from slobench.cli import main

raise SystemExit(main())
