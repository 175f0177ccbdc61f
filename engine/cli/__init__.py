"""The ``kvtrim`` command line: ask, summarize, chat, models, serve, bench and the
self-test; ``types`` holds the argument types they share."""
