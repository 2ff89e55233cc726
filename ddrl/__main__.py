import sys

from ddrl.cli import main

sys.exit(main())
