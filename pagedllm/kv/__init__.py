"""The paged KV memory system: pure bookkeeping over integers, no torch."""
