import sys
from pathlib import Path

# The tests import shared helpers from this folder.
sys.path.insert(0, str(Path(__file__).resolve().parent))
