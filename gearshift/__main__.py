import sys

from gearshift.cli import main

sys.exit(main())
