"""An OpenAI-compatible server with the eviction policy as its configuration
(``api.create_app``; ``kvtrim serve`` in cli.py). Imported only when serving."""
