"""Torture tools: Vectide tried as a hostile world would.

``python -m vectide.torture NAME`` (or ``make torture``) runs, each writing a
JSON report whose ``summary`` holds the figures:

- ``server``: ``vectide serve`` under concurrent HTTP writers (upserts,
  deletes, payload rewrites), SIGKILLed at random; after each restart every
  id is checked against the acknowledged history, and the restart time is
  measured (process start to the first answered query).
- ``db`` and ``engines``: the same in a child process, for a database
  collection of the default engine and of every engine that lives in a
  directory (``db:ENGINE``), and for each of those engines opened directly
  (``p-hnsw`` once per ``persist`` choice); the targets come from the
  registry (``targets.py``).
- ``corrupt``: the corruption matrix: every file of a database (catalog,
  WAL segments, point store, each engine's files) flipped, zeroed or
  truncated at its start, middle and end; each case must open intact,
  recover as documented, or fail with a typed error, never crash.
- ``badinput``: absurd inputs over HTTP and Python.

Small versions of each run in the test suite (``python/tests/test_torture.py``).
"""
