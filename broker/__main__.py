from plugbroker.cli import main

raise SystemExit(main())
