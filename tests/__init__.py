"""geco's tests, and the kits they share (imported as ``tests.<kit>``, the repo on sys.path)."""
