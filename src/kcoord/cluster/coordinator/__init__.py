"""The group coordinator: one pure shard per ``__consumer_offsets`` partition (DESIGN section 6)."""
