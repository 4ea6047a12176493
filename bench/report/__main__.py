"""``python -m bench.report [--check]``: regenerate BENCHMARKS.md (see ``bench.report.today``)."""
import sys

from bench.report.today import main

sys.exit(main())
