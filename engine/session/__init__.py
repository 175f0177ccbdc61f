"""One sequence read with eviction and answered: the session (``core``), its prompts,
sampling, recall of evicted text and the memory map (``trace``)."""
