import sys

from replayrl.cli.main import main

sys.exit(main())
