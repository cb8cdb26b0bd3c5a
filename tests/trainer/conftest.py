"""Make the test-only decoder importable from this folder's tests and their subprocesses."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
