import sys

from replayrl.cli import main

sys.exit(main())
