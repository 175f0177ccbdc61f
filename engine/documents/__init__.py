"""Documents: text out of files (``load``), by suffix; HTML, PDF and DOCX parsers
(``formats``); the size limits both enforce (``limits``)."""
