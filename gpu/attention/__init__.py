"""Attention over the paged KV cache: one operation for every step shape, several backends."""
