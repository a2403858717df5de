from drive.cli import main

raise SystemExit(main())
