from broker.cli import main

raise SystemExit(main())
