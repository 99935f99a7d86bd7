"""`python -m tunedb`: the same as the `tunedb` console script."""
import sys

from tunedb.cli import main

sys.exit(main())
