import sys

from spark_backend.cli import main

sys.exit(main())
