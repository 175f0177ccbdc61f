"""What a program opens: the ``Engine`` (a model and its session factory), the
request (``RequestSpec``, every option declared once), chats and batch summaries."""
