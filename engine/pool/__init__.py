"""Many sequences in one llama.cpp context: shares of one KV budget, the scheduler
that batches their steps, and the slot each session decodes through."""
