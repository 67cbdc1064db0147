"""Batched decoding: B sequences advance together, each keeping its own accepted drafts (ragged acceptance)."""
