import sys

from sandboxd.cli import main

sys.exit(main())
